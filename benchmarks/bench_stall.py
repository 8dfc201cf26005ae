"""What the stall watchdog's progress record costs a training step, in microseconds.

    python benchmarks/bench_stall.py [--quick]

Under x-launch (``--stall-timeout``, on by default) every rank updates its progress record at each
backward (enter and leave), each collective called through the accelerator (enter and leave) and
each optimizer step: integer stores into a memory-mapped file (``x_common.progress_record``).
This times the hooks of one plain step (one backward, one optimizer step) and of one extra
collective, with the record open (under x-launch) and without it (plain torchrun or python:
each hook is one global lookup), by calling the runtime's own hooks in a loop. Reported, never
asserted: a step of even a tiny model takes hundreds of microseconds.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from x_common import env
from x_runtime.process.operations import progress


def _per_step_us(loops: int, collectives: int) -> float:
    enter, leave, step_done, backward, reduce = (
        progress.enter,
        progress.leave,
        progress.step_done,
        progress.Phase.BACKWARD,
        progress.Phase.REDUCE,
    )
    start = time.perf_counter_ns()
    for _ in range(loops):
        enter(backward)
        leave()
        for _ in range(collectives):
            enter(reduce)
            leave()
        step_done()
    return (time.perf_counter_ns() - start) / loops / 1000


def _best(loops: int, repeat: int, collectives: int) -> float:
    return min(_per_step_us(loops, collectives) for _ in range(repeat))  # the least disturbed run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer loops (a smoke run)")
    args = parser.parse_args()
    loops, repeat = (20_000, 3) if args.quick else (200_000, 7)
    off_step, off_call = _best(loops, repeat, 0), _best(loops, repeat, 1)
    with tempfile.TemporaryDirectory() as folder:
        progress.open_progress(0, {env.PROGRESS_DIR.name: folder})  # what the Accelerator does under x-launch
        on_step, on_call = _best(loops, repeat, 0), _best(loops, repeat, 1)
    print(f"{'progress record':<18}{'per step (backward + optimizer step)':>40}{'per extra collective':>24}")
    print(f"{'off (no x-launch)':<18}{off_step:>37.2f} us{off_call - off_step:>21.2f} us")
    print(f"{'on (x-launch)':<18}{on_step:>37.2f} us{on_call - on_step:>21.2f} us")


if __name__ == "__main__":
    main()
