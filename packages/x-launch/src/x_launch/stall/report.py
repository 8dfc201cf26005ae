"""The words of the stall watchdog: where each rank is, and which ranks are slower than the rest.

``describe_stall`` turns each rank's progress record (``x_common.progress_record``) and its
stack dump (``x_launch.stall.stacks``) into one summary: the ranks that are not waiting for the others
first (the likely cause), each with the line of the user's script it is on, then the ranks that
wait, grouped by collective and line::

    x-launch: rank 1 is not in a collective: at train.py:42 in main: time.sleep(600) (step 3)
    x-launch: ranks 0, 2 wait in all_reduce (backward) at train.py:57 in main: accelerator.backward(loss) (step 3, for 11 s)

``stragglers`` reads the same records' step times. A rank's step time under DDP is the same on
every rank (they wait for each other inside backward), so a straggler is found by its time
outside backward and the collectives: the work only it does (data, forward, optimizer). A rank
is named when its median of that exceeds the median over ranks by more than ``MARGIN`` (and by
``FLOOR_MS`` at least, so that microsecond jitter on tiny steps names nobody).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from x_common.progress_record import Phase, Snapshot
from x_launch.stall.stacks import Frame, Stack, waits_for_dataloader, waits_in_collective, where

__all__ = ["FLOOR_MS", "MARGIN", "MIN_STEPS", "RankDump", "describe_stall", "out_of_step", "stragglers"]

MARGIN = 0.20  # a rank 20 % slower than the median rank outside collectives is a straggler
FLOOR_MS = 1.0
MIN_STEPS = 3  # steps a rank must have timed (after its first, which includes the setup)

_CALLS = {
    Phase.BACKWARD: ("all_reduce", "backward"),
    Phase.GATHER: ("all_gather", "accelerator.gather"),
    Phase.GATHER_OBJECT: ("all_gather_object", "accelerator.gather_for_metrics"),
    Phase.REDUCE: ("all_reduce", "accelerator.reduce"),
    Phase.PAD: ("all_gather", "accelerator.pad_across_processes"),
    Phase.BROADCAST: ("broadcast", "accelerator broadcast"),
    Phase.BARRIER: ("barrier", "accelerator.wait_for_everyone"),
}


@dataclass(frozen=True)
class RankDump:
    """One rank's answer to the dump signal: its threads, and those of the processes it forked."""

    stacks: tuple[Stack, ...]
    children: tuple[tuple[int, tuple[Stack, ...]], ...] = ()  # (pid, stacks) of DataLoader workers and the like


def _main_stack(snapshot: Snapshot, stacks: Sequence[Stack]) -> Stack | None:
    """The main thread's (a forked child's main thread has its parent's id), else the first."""
    for stack in stacks:
        if stack.thread == snapshot.thread:
            return stack
    return stacks[0] if stacks else None


def _at(frame: Frame | None) -> str:
    if frame is None:
        return "(no Python frame)"
    source = frame.source().split("  #", 1)[0]  # the code without its comment
    return f"{frame.shown()}: {source}" if source else frame.shown()


def _seconds(ns: int) -> str:
    return f"{max(0, ns) / 1e9:.0f} s"


def _state(snapshot: Snapshot, stack: Stack | None) -> tuple[bool, str]:
    """(waits for the others, what): e.g. ``(True, "in all_reduce (backward)")``.

    The record says which accelerator call the rank is in; the stack says which torch.distributed
    function (a raw ``dist.recv`` in the user's code too). Backward has no such frame: DDP's
    all-reduce runs in C++ autograd hooks.
    """
    called = waits_in_collective(stack) if stack is not None else None
    if snapshot.phase in _CALLS:
        collective, call = _CALLS[snapshot.phase]
        return True, f"in {called or collective} ({call})"
    if called is not None:
        return True, f"in {called} (torch.distributed)"
    if stack is not None and waits_for_dataloader(stack):
        return False, "waiting for a batch from its DataLoader"
    return False, "not in a collective"


def describe_stall(
    snapshots: Sequence[Snapshot], dumps: Mapping[int, RankDump], now_ns: int | None = None
) -> list[str]:
    """The summary lines (without the ``x-launch:`` prefix) for ranks stuck as recorded and dumped."""
    now_ns = time.monotonic_ns() if now_ns is None else now_ns
    elsewhere: list[str] = []
    waiting: dict[tuple[str, str], list[Snapshot]] = {}
    for snapshot in sorted(snapshots, key=lambda s: s.rank):
        if snapshot.phase is Phase.EXITED:
            elsewhere.append(f"rank {snapshot.rank} has exited ({_after(snapshot.step)})")
            continue
        dump = dumps.get(snapshot.rank)
        stack = _main_stack(snapshot, dump.stacks if dump is not None else ())
        waits, what = _state(snapshot, stack)
        at = _at(where(stack)) if stack is not None else "(no stack: the process did not answer)"
        if waits:
            waiting.setdefault((what, at), []).append(snapshot)
            continue
        quiet = _seconds(now_ns - snapshot.beat_ns)
        elsewhere.append(
            f"rank {snapshot.rank} is {what}: at {at} ({_after(snapshot.step)}; its last backward, collective or "
            f"optimizer step was {quiet} ago)"
        )
        for pid, child in dump.children if dump is not None else ():
            worker = _main_stack(snapshot, child)
            kind = "DataLoader worker" if worker is not None and _is_worker(worker) else "child process"
            elsewhere.append(f"  its {kind} (pid {pid}) is at {_at(where(worker)) if worker else '(no stack)'}")
    lines = out_of_step(snapshots) + elsewhere
    for (what, at), group in waiting.items():
        ranks = ", ".join(str(s.rank) for s in group)
        who = f"rank {ranks} waits" if len(group) == 1 else f"ranks {ranks} wait"
        steps = sorted({s.step for s in group})
        step = _after(steps[0]) if len(steps) == 1 else f"after {steps[0]}-{steps[-1]} steps"
        longest = _seconds(now_ns - min(s.beat_ns for s in group))
        lines.append(f"{who} {what} at {at} ({step}, for {longest})")
    return lines


def _after(steps: int) -> str:
    return f"after {steps} step" if steps == 1 else f"after {steps} steps"


def _call(phase: Phase) -> str:
    return _CALLS[phase][1] if phase in _CALLS else "an unknown call"


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def out_of_step(snapshots: Sequence[Snapshot]) -> list[str]:
    """One line naming the first call (backward or collective) where the ranks' sequences differ, if any.

    Each record keeps its last calls in order. A rank that skipped a collective made, at that
    position, the call the others made next: that is said as "skipped". When no call differs but
    some ranks made fewer, the first call they did not make is named (the one the others wait in).
    """
    live = [s for s in sorted(snapshots, key=lambda s: s.rank) if s.calls]
    if len(live) < 2:
        return []
    first = {s.rank: s.calls - len(s.last_calls) for s in live}  # index of each record's oldest call
    for index in range(max(first.values()), min(s.calls for s in live)):
        made = {s.rank: s.last_calls[index - first[s.rank]] for s in live}
        groups: dict[tuple[int, Phase], list[int]] = {}
        for rank, entry in made.items():
            groups.setdefault(entry, []).append(rank)
        if len(groups) == 1:
            continue
        usual, *odd = sorted(groups, key=lambda entry: (-len(groups[entry]), min(groups[entry])))
        (steps, phase), who = usual, groups[usual]
        parts = [f"{_ranks(groups[e])} made {_call(e[1])} {_after(e[0])}" for e in odd]
        line = f"the ranks went out of step at call {index + 1}: {_ranks(who)} made {_call(phase)} {_after(steps)}"
        line += ", " + ", ".join(parts)
        ahead = [s for s in live if s.rank in who and s.calls > index + 1]
        following = ahead[0].last_calls[index + 1 - first[ahead[0].rank]] if ahead else None
        skipped = [rank for entry in odd if entry == following for rank in groups[entry]]
        if skipped:
            line += f": {_ranks(skipped)} skipped {_call(phase)}"
        return [line]
    calls = sorted({s.calls for s in live})
    if len(calls) > 1:  # no call differs, but some ranks have not made the next call yet
        ahead = [s for s in live if s.calls > calls[0]]
        behind = [s.rank for s in live if s.calls == calls[0]]
        if calls[0] >= first[ahead[0].rank]:
            steps, phase = ahead[0].last_calls[calls[0] - first[ahead[0].rank]]
            what = f"call {calls[0] + 1} ({_call(phase)} {_after(steps)})"
            return [f"{_ranks(behind)} did not make {what}, which {_ranks([s.rank for s in ahead])} made"]
    return []


def _is_worker(stack: Stack) -> bool:
    return any(frame.file.replace("\\", "/").endswith("torch/utils/data/_utils/worker.py") for frame in stack.frames)


@dataclass(frozen=True)
class StepTimes:
    rank: int
    steps: int
    median_ms: float
    p95_ms: float
    own_median_ms: float
    own_p95_ms: float


def _p95(values: Sequence[int]) -> float:
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


def step_times(snapshot: Snapshot) -> StepTimes | None:
    """A rank's step time statistics in ms, or ``None`` with fewer than ``MIN_STEPS`` timed steps."""
    whole, own = list(snapshot.step_us), list(snapshot.own_us)
    if snapshot.step == len(whole):  # the ring still holds the first step, which includes the setup
        whole, own = whole[1:], own[1:]
    if len(whole) < MIN_STEPS:
        return None
    ms = 1000.0
    return StepTimes(
        snapshot.rank,
        len(whole),
        statistics.median(whole) / ms,
        _p95(whole) / ms,
        statistics.median(own) / ms,
        _p95(own) / ms,
    )


def stragglers(snapshots: Sequence[Snapshot]) -> list[str]:
    """Step time lines (without the prefix), or [] with fewer than two ranks that timed steps.

    One line when no rank is slower than the others by more than the margin; otherwise every
    rank's median and p95, and one line per straggler.
    """
    times = [t for t in (step_times(s) for s in sorted(snapshots, key=lambda s: s.rank)) if t is not None]
    if len(times) < 2:
        return []
    middle = statistics.median(t.own_median_ms for t in times)
    slow = [t for t in times if t.own_median_ms > middle * (1 + MARGIN) and t.own_median_ms - middle > FLOOR_MS]
    steps = min(t.steps for t in times)
    if not slow:
        low, high = min(t.median_ms for t in times), max(t.median_ms for t in times)
        p95 = max(t.p95_ms for t in times)
        return [
            f"step time over the last {steps} steps: median {low:.1f}-{high:.1f} ms, p95 up to {p95:.1f} ms "
            f"across {len(times)} ranks; no straggler (none {MARGIN:.0%} slower than the median outside collectives)"
        ]
    lines = [f"step time over the last {steps} steps, median / p95 (outside backward and collectives in brackets):"]
    for t in times:
        mark = "  <- straggler" if t in slow else ""
        lines.append(
            f"  rank {t.rank}: {t.median_ms:.1f} / {t.p95_ms:.1f} ms "
            f"({t.own_median_ms:.1f} / {t.own_p95_ms:.1f} ms){mark}"
        )
    for t in slow:
        lines.append(
            f"straggler: rank {t.rank} spends {t.own_median_ms:.1f} ms per step outside backward and collectives, "
            f"the median rank {middle:.1f} ms (margin {MARGIN:.0%})"
        )
    return lines
