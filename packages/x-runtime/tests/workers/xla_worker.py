"""Started by ``x-launch --tpu``: every XLA process calls ``main()`` and reports what it saw.

x-launch --tpu [--num_processes 1] xla_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, set_seed


def main() -> None:
    out = Path(sys.argv[1])
    accelerator = Accelerator()
    set_seed(0)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(3):
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    rank = torch.tensor([accelerator.process_index], device=accelerator.device)
    weights = accelerator.get_state_dict(model)
    report = {
        "distributed_type": accelerator.distributed_type,
        "device": str(accelerator.device),
        "world": accelerator.num_processes,
        "losses": losses,
        "weights": torch.cat([w.flatten() for w in weights.values()]).tolist(),
        "gathered_ranks": accelerator.gather(rank).cpu().tolist(),
        "rank_sum": accelerator.reduce(rank.float(), "sum").item(),
        "objects": accelerator.gather_for_metrics([f"rank{accelerator.process_index}"], use_gather_object=True),
    }
    tmp = out / f".rank{accelerator.process_index}.json.tmp"
    tmp.write_text(json.dumps(report))
    tmp.replace(out / f"rank{accelerator.process_index}.json")
    accelerator.wait_for_everyone()
