"""The script bench_launch.py launches: join a gloo group, one barrier, leave; note this rank in a file.

    BENCH_LAUNCH_RANKS=FILE x-launch --num_processes 2 --cpu barrier.py

Every process appends one line to $BENCH_LAUNCH_RANKS: its RANK, or "-" when it was started
without a distributed environment (no RANK: a launcher that ran one plain process), in which case
it exits at once, so that the benchmark can count how many processes a launcher really started.
"""

from __future__ import annotations

import os

import torch.distributed as dist

if "RANK" in os.environ:
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
with open(os.environ["BENCH_LAUNCH_RANKS"], "a") as f:
    f.write(os.environ.get("RANK", "-") + "\n")
