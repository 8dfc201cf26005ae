"""Errors of the user's input that one line explains, and the hook that prints them so.

A missing checkpoint folder is not a bug in x or in the script: the traceback through x's
internals (20 lines, 75 on two processes) hides the one line that says what to fix. Errors that
mix in ``OneLineError`` end a script with ``error: <message>`` on stderr and exit code 1, once per
job when every rank raised the same agreed error (``job_wide``), and with the full traceback when
the run asked for it (``x-launch --debug``, ``X_DEBUG_MODE=1``). An allocation failure is one line
too, per rank that ran out (``core/out_of_memory.py``).

The hook is installed only over Python's own (``sys.__excepthook__``): IPython, a debugger or a
library that set its own hook keeps it, and every other exception goes to the hook it replaced.
"""

from __future__ import annotations

import sys
from types import TracebackType

from x_runtime.core.out_of_memory import describe_out_of_memory, first_on_host, is_out_of_memory

__all__ = [
    "CheckpointNotFoundError",
    "FailedElsewhereError",
    "JobError",
    "OneLineError",
    "install_one_line_hook",
    "set_rank",
]


class OneLineError(Exception):
    """An error whose message alone tells the user what is wrong and how to fix it."""

    # True: every rank raises it with the same message (an agreed failure), so one rank says it.
    job_wide = False


class CheckpointNotFoundError(OneLineError, FileNotFoundError):
    """``load_state`` was given a folder that holds no checkpoint."""


class JobError(OneLineError, RuntimeError):
    """Every rank learnt that some ranks failed with one-line errors; the message names them."""

    job_wide = True


class FailedElsewhereError(OneLineError, RuntimeError):
    """This rank did its part; others failed, and their own tracebacks say where (one per failure)."""

    job_wide = True


class _Hook:
    def __init__(self, rank: int, traceback: bool, previous: object, ranks_on_host: int = 1) -> None:
        self.rank = rank
        self.traceback = traceback
        self.previous = previous
        self.ranks_on_host = ranks_on_host

    def __call__(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if isinstance(value, OneLineError) and not self.traceback:
            if not value.job_wide or self.rank == 0:
                sys.stderr.write(f"error: {value}\n")
                sys.stderr.flush()
            return
        if not self.traceback and is_out_of_memory(value):
            line = describe_out_of_memory(self.rank, kind, value, tb)
            # Ranks one agent started run out together: the first speaks, the others log their tracebacks.
            if self.ranks_on_host <= 1 or first_on_host():
                sys.stderr.write(f"error: {line}\n")
                sys.stderr.flush()
            return
        self.previous(kind, value, tb)  # type: ignore[operator]


_INSTALLED: list[_Hook] = []  # the process's hook, once installed (torch may wrap it afterwards)


def install_one_line_hook(*, traceback: bool, ranks_on_host: int = 1) -> bool:
    """Print ``OneLineError``s as one line at exit; return whether the hook is in place.

    Call it before the process group is joined: torch's ``init_process_group`` wraps the hook it
    finds (prefixing ``[rank<n>]:``), so the line keeps the rank's name. ``set_rank`` tells the hook
    the rank once it is known.

    Args:
        traceback: print the full traceback instead (the run's debug setting).
        ranks_on_host: ranks the launcher started beside this one (``LOCAL_WORLD_SIZE``): with
            several, an out-of-memory line is said by the first of them to run out.
    """
    if _INSTALLED:
        _INSTALLED[0].traceback = traceback
        _INSTALLED[0].ranks_on_host = ranks_on_host
        return True
    if sys.excepthook is not sys.__excepthook__:
        return False
    hook = _Hook(0, traceback, sys.excepthook, ranks_on_host)
    sys.excepthook = hook
    _INSTALLED.append(hook)
    return True


def set_rank(rank: int) -> None:
    """This process's global rank: a ``job_wide`` error is printed by rank 0 only."""
    for hook in _INSTALLED:
        hook.rank = rank
