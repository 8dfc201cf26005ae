"""Two ranks read ``preemption_requested`` every step; rank 1 alone is asked to stop at step 5.

    torchrun --nproc_per_node 2 preemption_worker.py OUT_DIR MARKER_PREFIX

Rank 1 creates its own marker (``MARKER_PREFIX.rank1``, the file its launcher would create) at
step 5; rank 0's marker never appears. Each rank reports the first step at which the property was
True, the agreed number of accesses between two all-reduces, and the cost of one access when
nothing happened next to one training step of a small model (DDP over gloo), both as medians
over 100 steps.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch
from _helpers import rank, report

from x_common import env

env.PREEMPTION_FILE.write(f"{sys.argv[2]}.rank{rank()}")  # one marker per rank, as one launcher per node
from x_runtime import Accelerator  # noqa: E402 - the marker's path is read on the first access

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
data = torch.randn(64, 256)
access, step_time = [], []
for _ in range(100):  # nothing requested: the cost of an access beside a step
    start = time.perf_counter()
    loss = model(data).square().mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    middle = time.perf_counter()
    assert not accelerator.preemption_requested
    access.append(time.perf_counter() - middle)
    step_time.append(middle - start)
seen = None
for step in range(1, 2000):
    if step == 5 and rank() == 1:
        Path(f"{sys.argv[2]}.rank1").write_text("preempted")
    if accelerator.preemption_requested:
        seen = step
        break
report(
    {
        "seen_at": seen,
        "interval": accelerator.__dict__["_preemption"]._interval,  # accesses between two all-reduces
        "still": accelerator.preemption_requested,
        "access_us": statistics.median(access) * 1e6,
        "step_us": statistics.median(step_time) * 1e6,
        "pid": os.getpid(),
    }
)
