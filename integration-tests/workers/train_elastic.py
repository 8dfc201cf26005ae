"""Train two epochs with a checkpoint after every step, for an elastic job that loses a machine.

    x-launch --num_machines 2:3 ... train_elastic.py OUT PROJECT_DIR [--pace S]

Started afresh (a restart after a machine was lost starts the script again) it loads the latest
complete checkpoint, if any, and goes on at whatever world size the rendezvous formed. The dataset
indices ``gather_for_metrics`` returned at each step are kept in the checkpoint itself (a
registered object), so the history rank 0 writes at the end (``OUT/final.json``) is what the
committed training saw, however the run was interrupted. Every process writes
``OUT/attempt-<pid>.json`` (world size, rank, machine rank, address) when it starts; rank 0
writes the step count to ``OUT/progress`` after each checkpoint, so a test strikes mid-epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, ProjectConfiguration, set_seed

SAMPLES, BATCH, EPOCHS = 96, 4, 2


class History:
    """The gathered indices of every step, saved and restored with the checkpoint."""

    def __init__(self) -> None:
        self.steps: list[list] = []

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


def _write(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("project")
    parser.add_argument("--pace", type=float, default=0.0)
    args = parser.parse_args()
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=args.project, automatic_checkpoint_naming=True, total_limit=3),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
    )
    address = os.environ.get("X_TEST_HOST", socket.gethostname())
    _write(
        args.out / f"attempt-{os.getpid()}.json",
        {
            "world": accelerator.num_processes,
            "rank": accelerator.process_index,
            "machine_rank": int(os.environ.get("GROUP_RANK", "0")),
            "address": address,
            "started": time.time(),
        },
    )
    set_seed(3)
    g = torch.Generator().manual_seed(4)
    x, index = torch.randn(SAMPLES, 6, generator=g), torch.arange(SAMPLES)
    data = TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)), index)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    net, opt, loader = accelerator.prepare(net, opt, DataLoader(data, batch_size=BATCH, shuffle=True))
    history = History()
    accelerator.register_for_checkpointing(history)
    if (Path(args.project) / "checkpoints").is_dir():
        accelerator.load_state()
    while loader.epoch < EPOCHS:
        epoch = loader.epoch
        for xb, yb, ib in loader:
            loss = torch.nn.functional.mse_loss(net(xb), yb)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            gathered = accelerator.gather_for_metrics(ib).tolist()
            history.steps.append([epoch, accelerator.num_processes, gathered])
            accelerator.save_state()
            if accelerator.is_main_process:
                _write(args.out / "progress", len(history.steps))
            time.sleep(args.pace)
    if accelerator.is_main_process:
        weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(net).parameters()])
        _write(args.out / "final.json", {"steps": history.steps, "weights": weights.tolist()})
    accelerator.end_training()


if __name__ == "__main__":
    main()
