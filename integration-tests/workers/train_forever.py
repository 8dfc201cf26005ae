"""Train with an Accelerator until stopped from outside (at most ``--max-seconds``).

    x-launch --num_processes 2 --cpu train_forever.py READY_DIR

Each rank writes its pid to ``READY_DIR/ready<rank>`` once it has taken a few optimizer steps,
then keeps training (every step all-reduces gradients, so the ranks wait on each other). A test
kills a rank or the launcher while the job is in that loop.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, set_seed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ready_dir")
    parser.add_argument("--max-seconds", type=float, default=120)
    args = parser.parse_args()

    accelerator = Accelerator()
    rank = accelerator.process_index
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 12, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    steps, deadline = 0, time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        for xb, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if steps == 3:
                ready = Path(args.ready_dir, f"ready{rank}")
                Path(f"{ready}.tmp").write_text(str(os.getpid()))
                Path(f"{ready}.tmp").rename(ready)
            time.sleep(0.01)  # leave the CPUs to the test that watches
    raise SystemExit(f"rank {rank}: nobody stopped this job within {args.max_seconds} s")


if __name__ == "__main__":
    main()
