"""The script bench_threads.py launches: time training steps of a 1.6M-parameter MLP with plain torch.

    BENCH_THREADS_OUT=FILE <launcher> mlp_steps.py STEPS

Plain PyTorch (DDP by hand when started with a distributed environment), so the launcher, and the
threads it gives each process, is the only thing that differs between rows. Every rank appends one
JSON line: its rank, torch's intra-op threads, OMP_NUM_THREADS as it found it, and the median time
of a step after a warm-up.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
WARM_UP = 5

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
)
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))
times = []
for step in range(WARM_UP + STEPS):
    start = time.perf_counter()
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    if step >= WARM_UP:
        times.append(time.perf_counter() - start)
report = {
    "rank": int(os.environ.get("RANK", "0")),
    "threads": torch.get_num_threads(),
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "step": statistics.median(times),
}
with open(os.environ["BENCH_THREADS_OUT"], "a") as out:
    out.write(json.dumps(report) + "\n")
if distributed:
    del model, optimizer  # a DDP wrapper alive at exit can abort gloo's teardown (see shared/probes)
    dist.destroy_process_group()
