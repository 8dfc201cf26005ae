"""A short data-parallel training under x-launch: every rank writes its losses and a weight checksum.

Run by test_installs.py as ``x-launch --num_processes 2 --cpu train_two_processes.py`` inside a venv
holding only x-common, x-launch, x-runtime and torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, set_seed


def main() -> None:
    accelerator = Accelerator()
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(3):
        total = torch.zeros(())
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach()
        losses.append(accelerator.reduce(total / len(loader), reduction="mean").item())
    weights = accelerator.unwrap_model(model).weight.detach()
    report = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "batches_per_epoch": len(loader),
        "losses": losses,
        "weight_sum": weights.sum().item(),
    }
    # One file per rank: two ranks printing at once may interleave their lines on the shared pipe.
    Path(f"report-{accelerator.process_index}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
