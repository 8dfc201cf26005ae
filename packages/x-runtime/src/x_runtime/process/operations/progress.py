"""This rank's progress, kept for x-launch's stall watchdog (``--stall-timeout``).

When x-launch names a folder in ``X_PROGRESS_DIR``, the first ``Accelerator`` of a process opens
that rank's record there (``x_common.progress_record``: a memory-mapped file, updated by integer
stores) and registers ``faulthandler`` to write every thread's Python stack into
``rank-<N>.stacks`` when the process gets ``DUMP_SIGNAL``. ``faulthandler`` writes from the C
signal handler itself, so a rank blocked inside a C++ collective, with the interpreter never
getting back to Python, still answers. A process this rank forks (a DataLoader worker under the
fork start method) registers its own file, so a rank waiting for a stuck worker shows the worker's
stack too.

The record belongs to the process, as torch's default process group does: two ``Accelerator``
objects in one process beat the same record, which is right, since it says where the process is.
Without the variable (plain ``torchrun``, ``srun python``, one process in a notebook) nothing is
opened and each hook below is one global lookup.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import glob
import os
import signal
from collections.abc import Mapping
from typing import IO

from x_common import env
from x_common.progress_record import Phase, RecordWriter, record_path, stacks_path

__all__ = ["DUMP_SIGNAL", "Phase", "during", "enter", "leave", "open_progress", "step_done"]

# A real-time signal nobody else uses: USR1/USR2/TERM/HUP may be preemption signals, which the
# workers ignore or handle; faulthandler's handler would take them over.
DUMP_SIGNAL = int(signal.SIGRTMIN) + 6 if hasattr(signal, "SIGRTMIN") else 0

_RECORD: RecordWriter | None = None
_STACKS: list[IO[str]] = []  # the open dump files: faulthandler writes to their descriptors
_FOLDER: str | None = None
_RANK = 0


def open_progress(rank: int, environ: Mapping[str, str]) -> None:
    """Open this process's record and register the stack dump, once per process (no-op without x-launch)."""
    global _RECORD, _FOLDER, _RANK
    folder = env.PROGRESS_DIR.read(environ)
    if folder is None or _RECORD is not None or not DUMP_SIGNAL:
        return
    try:
        record = RecordWriter(record_path(folder, rank), rank=rank, dump_signal=DUMP_SIGNAL)
        _register_dump(stacks_path(folder, rank))
    except (OSError, ValueError, RuntimeError):
        return  # the launcher's folder is gone or unwritable: the job runs unwatched, as without x-launch
    _RECORD, _FOLDER, _RANK = record, folder, rank
    atexit.register(record.exited)
    os.register_at_fork(after_in_child=_in_forked_child)


def _register_dump(path: str) -> None:
    stacks = open(path, "w")  # noqa: SIM115 - kept open for the life of the process, for faulthandler
    _STACKS.append(stacks)
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=False)


def _in_forked_child() -> None:
    # The child must not write its parent's record (the mapping is shared), but it gets a dump
    # file of its own: x-launch signals the children it finds registered there.
    global _RECORD
    if _RECORD is None or _FOLDER is None:
        return
    _RECORD = None
    _forget_dead_children(_FOLDER, _RANK)
    try:
        _register_dump(stacks_path(_FOLDER, _RANK, child=os.getpid()))
    except (OSError, ValueError, RuntimeError):
        faulthandler.unregister(DUMP_SIGNAL)  # the parent's file is not this process's to write


def _forget_dead_children(folder: str, rank: int) -> None:
    # DataLoader workers come and go each epoch: their files would pile up over a long job.
    for path in glob.glob(stacks_path(folder, rank, child=0).replace("child-0", "child-*")):
        pid = path.rsplit("child-", 1)[1].split(".")[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(path)
        except (OSError, ValueError):
            continue


def enter(phase: Phase) -> None:
    """This rank now waits in ``phase`` (a collective, or backward with its gradient all-reduce)."""
    record = _RECORD
    if record is not None:
        record.enter(phase)


def leave() -> None:
    """This rank left the phase of the matching ``enter``."""
    record = _RECORD
    if record is not None:
        record.leave()


def step_done() -> None:
    """One optimizer step finished on this rank."""
    record = _RECORD
    if record is not None:
        record.step_done()


class _During:
    """``enter(phase)`` ... ``leave()`` around a ``with`` block; stateless, so one per phase serves all."""

    __slots__ = ("phase",)

    def __init__(self, phase: Phase) -> None:
        self.phase = phase

    def __enter__(self) -> None:
        enter(self.phase)

    def __exit__(self, *_: object) -> None:
        leave()


# Made once: a generator-based context manager would cost a microsecond per collective even unwatched.
_DURING = {phase: _During(phase) for phase in Phase}


def during(phase: Phase) -> _During:
    """``with during(Phase.REDUCE): ...``: the block is that phase (for calls far costlier than this)."""
    return _DURING[phase]
