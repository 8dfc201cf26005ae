"""``python -m x_launch.run.torchrun_agent ARGS``: torchrun itself, its failures handed to x-launch as torch holds them.

x-launch starts torchrun's elastic agent (``torch.distributed.run``, unchanged: rendezvous,
restarts, failure propagation) through this module. When the agent raises, the failure is read
from the exception object, ``ChildFailedError.failures`` (or the agent's own error, such as a
rendezvous timeout), and written to the file ``X_FAILURE_REPORT`` names, for x-launch's summary
(``x_launch.run.failures``); then the exception goes on as torchrun's own would, with the same output
and exit code. Without ``X_FAILURE_REPORT`` this is plain torchrun.
"""

from __future__ import annotations

import sys

from x_common import env
from x_launch.run.failures import AgentError, root_cause, write_report

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    report = env.FAILURE_REPORT.read()
    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        if report is not None:
            write_report(report, root_cause(failed))
        raise
    except Exception as exc:
        if report is not None:
            message = str(exc).strip().splitlines()
            write_report(report, AgentError(type(exc).__name__, message[0] if message else ""))
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
