"""Run the engine as a child, pass SIGINT/SIGTERM on to it, and exit as it did.

torchrun's agent already stops every worker when one fails and when it is told to stop; the
launcher only has to make sure the signal reaches it and that its exit status comes back.
"""

from __future__ import annotations

import os
import signal
import subprocess
from types import FrameType

from x_launch.launch_plan import LaunchPlan

__all__ = ["run_plan"]


def run_plan(plan: LaunchPlan) -> int:
    """Start the plan's command and wait; the exit code (128 + N for a signal N)."""
    child = subprocess.Popen(plan.argv, env={**os.environ, **plan.env})

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code
