"""One rank's progress record: a small memory-mapped file the rank writes and x-launch reads.

x-launch's stall watchdog (``--stall-timeout``) must see, without a collective and without
asking the rank anything, whether each rank still moves: which step it is at, which collective
it is in and since when, and how long its recent steps took. Each rank started by x-launch maps
``<X_PROGRESS_DIR>/rank-<N>.progress`` into memory and updates it with integer stores into that
mapping: no system call, no lock, nothing the step waits for (the kernel writes the page back
lazily, or never on a tmpfs). x-launch reads the same file through the page cache.

The file is a flat array of signed 64-bit integers (``SLOTS`` says where each lives), followed by
two rings of the last ``RING`` steps' durations in microseconds: the whole step, and the part of
it spent outside the calls that wait for other ranks (backward, collectives), from which the
straggler report is made. A torn read (a slot read while being written) is harmless: every
decision reads one slot at a time, and a summary that is off by one step says the same.

Examples:
    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> record = RecordWriter(os.path.join(folder, "rank-0.progress"), rank=0)
    >>> record.enter(Phase.GATHER); record.leave(); record.step_done()
    >>> snapshot = read_record(os.path.join(folder, "rank-0.progress"))
    >>> snapshot.rank, snapshot.step, snapshot.phase, snapshot.calls, snapshot.last_calls
    (0, 1, <Phase.NONE: 0>, 1, ((0, <Phase.GATHER: 2>),))
"""

from __future__ import annotations

import ctypes
import enum
import mmap
import os
import threading
import time
from dataclasses import dataclass

__all__ = ["CALLS", "RING", "Phase", "RecordWriter", "Snapshot", "read_record", "record_path", "stacks_path"]

MAGIC = 0x58_50_52_4F_47_31  # "XPROG1": a file of this layout
RING = 1024  # steps kept for the straggler report (the last ones)
CALLS = 32  # calls (backward, collectives) kept, to find a rank that skipped one


class Phase(enum.IntEnum):
    """What a rank is in; NONE is its own code, between the calls the runtime knows of."""

    NONE = 0
    BACKWARD = 1  # DDP's gradient all-reduce (FSDP's reduce-scatter) runs inside it
    GATHER = 2
    GATHER_OBJECT = 3
    REDUCE = 4
    PAD = 5
    BROADCAST = 6
    BARRIER = 7
    EXITED = 8  # the process ran its exit handlers


# Slot numbers in the array of int64.
_MAGIC, _PID, _RANK, _THREAD, _SIGNAL, _BEAT_NS, _STEP, _PHASE, _ARMED, _CALLS = range(10)
_BACKWARD = int(Phase.BACKWARD)
_HEADER = 16  # slots before the rings (a few spare)
_STEP_RING = _HEADER
_OWN_RING = _HEADER + RING
_CALL_RING = _HEADER + 2 * RING  # each call as step << 8 | phase
_SLOTS = _HEADER + 2 * RING + CALLS
SIZE = _SLOTS * 8


def record_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank-{rank}.progress")


def stacks_path(folder: str, rank: int, child: int | None = None) -> str:
    """Where rank ``rank`` (or its forked child ``child``, a DataLoader worker) dumps its stacks."""
    return os.path.join(folder, f"rank-{rank}.stacks" if child is None else f"rank-{rank}.child-{child}.stacks")


class RecordWriter:
    """The rank's side: integer stores into the mapped file (see the module docstring).

    ``enter``/``leave`` bracket a call that waits for other ranks; nested calls (a reduce inside a
    gather) keep the outer one's phase. Every ``enter``, ``leave`` and ``step_done`` is a beat (its
    time is stored): the watchdog calls a job stalled only when no rank beat for the whole
    timeout, so a long step that still enters and leaves collectives or backward is progressing.
    Each method is a handful of stores and one clock read (about a microsecond in all per step).
    """

    def __init__(self, path: str, *, rank: int, dump_signal: int = 0) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)  # the mapping keeps the file
        # A ctypes array over the mapping: an item store is a plain 8-byte write, the cheapest from Python.
        self._slots = (ctypes.c_int64 * _SLOTS).from_buffer(self._map)
        self._depth = 0
        self._calls = 0
        self._step = 0
        self._entered = 0
        self._waited = 0  # ns spent inside enter/leave so far
        self._last_step = time.monotonic_ns()
        self._waited_at_step = 0
        self._backward = 0  # 0: never a backward; 1: one since the last step; 2: none since
        self._armed = False
        slots = self._slots
        slots[_PID], slots[_RANK], slots[_THREAD] = os.getpid(), rank, threading.main_thread().ident or 0
        slots[_SIGNAL], slots[_BEAT_NS] = dump_signal, self._last_step
        slots[_MAGIC] = MAGIC  # last: a reader takes the record as valid from here on

    def enter(self, phase: int) -> None:
        """Entering ``phase`` (a ``Phase``; callers on the hot path pass its plain int)."""
        self._depth += 1
        if self._depth > 1:
            return
        now = self._entered = time.monotonic_ns()
        slots = self._slots
        calls = self._calls
        slots[_CALL_RING + calls % CALLS] = self._step << 8 | phase
        slots[_CALLS] = self._calls = calls + 1
        slots[_PHASE] = phase
        slots[_BEAT_NS] = now
        if phase == _BACKWARD:
            self._backward = 1
            if not self._armed:  # training has started: setup before it may take as long as it takes
                slots[_ARMED] = self._armed = True

    def leave(self) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        now = time.monotonic_ns()
        self._waited += now - self._entered
        slots = self._slots
        slots[_PHASE] = 0
        slots[_BEAT_NS] = now

    def step_done(self) -> None:
        """One optimizer step finished: count it and keep its duration in the rings.

        Once backward goes through the accelerator, a step is counted once per backward: a second
        optimizer stepping after the same backward (a GAN's) is part of the same step.
        """
        if self._backward == 2:
            return
        if self._backward:
            self._backward = 2
        now = time.monotonic_ns()
        whole = now - self._last_step
        waited = self._waited
        self._last_step = now
        slots = self._slots
        index = self._step % RING
        slots[_STEP_RING + index] = whole // 1000
        slots[_OWN_RING + index] = (whole - waited + self._waited_at_step) // 1000
        self._waited_at_step = waited
        slots[_STEP] = self._step = self._step + 1
        slots[_BEAT_NS] = now
        if not self._armed:
            slots[_ARMED] = self._armed = True

    def exited(self) -> None:
        """The process is ending normally (an exit handler): the watchdog says so instead of waiting."""
        self._slots[_PHASE] = Phase.EXITED


@dataclass(frozen=True)
class Snapshot:
    """What x-launch read from one record."""

    rank: int
    pid: int
    thread: int  # the main thread's id, as faulthandler prints it
    dump_signal: int
    beat_ns: int  # time.monotonic_ns() of the last enter, leave or step (one clock for a whole machine)
    step: int
    phase: Phase
    armed: bool
    step_us: tuple[int, ...]  # the last steps' durations, oldest first
    own_us: tuple[int, ...]  # the same steps' time outside backward and collectives
    calls: int  # backward and collective calls entered
    last_calls: tuple[tuple[int, Phase], ...]  # the last ``CALLS`` of them as (step, phase), oldest first


def read_record(path: str) -> Snapshot | None:
    """The record at ``path``, or ``None`` when it is missing or not (yet) a record."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(SIZE)
    except OSError:
        return None
    if len(data) < SIZE:
        return None
    slots = memoryview(data).cast("q")
    if slots[_MAGIC] != MAGIC:
        return None
    timed = slots[_STEP]
    kept = min(timed, RING)
    order = [(timed - kept + i) % RING for i in range(kept)]
    calls = slots[_CALLS]
    entries = [slots[_CALL_RING + (calls - min(calls, CALLS) + i) % CALLS] for i in range(min(calls, CALLS))]
    return Snapshot(
        rank=slots[_RANK],
        pid=slots[_PID],
        thread=slots[_THREAD],
        dump_signal=slots[_SIGNAL],
        beat_ns=slots[_BEAT_NS],
        step=slots[_STEP],
        phase=_phase(slots[_PHASE]),
        armed=bool(slots[_ARMED]),
        step_us=tuple(slots[_STEP_RING + i] for i in order),
        own_us=tuple(slots[_OWN_RING + i] for i in order),
        calls=calls,
        last_calls=tuple((entry >> 8, _phase(entry & 0xFF)) for entry in entries),
    )


def _phase(code: int) -> Phase:
    try:
        return Phase(code)
    except ValueError:  # a newer runtime's phase: shown as "not in a known call"
        return Phase.NONE
