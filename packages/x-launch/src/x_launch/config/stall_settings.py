"""The stall watchdog's rows of the settings table, and its exit code.

Apart from ``x_launch.stall.watch`` so that the settings table (read at every CLI start, ``--help``
included) does not load the watchdog itself.
"""

from __future__ import annotations

from typing import Any

from x_common.kinds import Bool, Choice, Int
from x_launch.config.option import flag_spellings

__all__ = ["ACTION_ROW", "DEFAULT_TIMEOUT", "EXIT_CODE", "STRAGGLER_ROW", "TIMEOUT_ROW"]

EXIT_CODE = 124  # as timeout(1): the job ran out of time without progress
DEFAULT_TIMEOUT = 900
ACTIONS = ("stop", "report")

# The rows of the settings table (``x_launch.config.launch_config``), declared here with what they steer.
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
# The end-of-job report reads the records the watchdog reads (so it needs stall_timeout > 0).
STRAGGLER_ROW: dict[str, Any] = {
    "kind": Bool(),
    "default": True,
    "doc": "at the end of a job of 2+ ranks: each rank's step time and the stragglers",
    "cli": flag_spellings("straggler_report"),
    "cli_help": "At the end of a job of two or more ranks, print each rank's step time (median, p95) and name the "
    "ranks slower than the others outside backward and collectives; false leaves it out. Default true (with "
    "--stall_timeout above 0). Config key: straggler_report.",
}
