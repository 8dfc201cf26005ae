"""The stall watchdog's two rows of the settings table, and its exit code.

Apart from ``x_launch.stall`` so that the settings table (read at every CLI start, ``--help``
included) does not load the watchdog itself.
"""

from __future__ import annotations

from typing import Any

from x_common.kinds import Choice, Int
from x_launch.option import flag_spellings

__all__ = ["ACTION_ROW", "DEFAULT_TIMEOUT", "EXIT_CODE", "TIMEOUT_ROW"]

EXIT_CODE = 124  # as timeout(1): the job ran out of time without progress
DEFAULT_TIMEOUT = 900
ACTIONS = ("stop", "report")

# The two rows of the settings table (``launch_config``), declared here with what they steer.
TIMEOUT_ROW: dict[str, Any] = {
    "kind": Int(minimum=0),
    "default": DEFAULT_TIMEOUT,
    "doc": "seconds without progress on any rank before x-launch shows every rank's stack (0: off)",
    "cli": flag_spellings("stall_timeout"),
    "cli_help": "Seconds without progress on any rank (no backward, collective or optimizer step) before x-launch "
    f"prints where every rank is, writes their stacks and stops the job (exit code {EXIT_CODE}); 0 turns the "
    f"watchdog off. Default {DEFAULT_TIMEOUT}. Config key: stall_timeout.",
}
ACTION_ROW: dict[str, Any] = {
    "kind": Choice(ACTIONS),
    "default": "stop",
    "doc": "after a stall report: stop the job, or report and keep waiting",
    "cli": flag_spellings("stall_action"),
}
