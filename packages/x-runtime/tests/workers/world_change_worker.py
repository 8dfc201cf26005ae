"""Trains with a checkpoint after every step; a later launch resumes it with another number of processes.

    world_change_worker.py OUT PROJECT stop K    stop after the K-th step's checkpoint (a world that ends)
    world_change_worker.py OUT PROJECT resume    load the latest checkpoint, finish the run
    world_change_worker.py OUT PROJECT load      load the latest checkpoint, train nothing

Each rank reports, per step, the epoch and the dataset indices ``gather_for_metrics`` returned:
across the two launches every index must appear once per epoch, whatever the two world sizes.
The loop resumes from the loader's own state (``use_stateful_dataloader``), so it needs no step
count, which would mean another position in another world.
"""

from __future__ import annotations

import sys

import torch
from _helpers import report
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, ProjectConfiguration, set_seed

SAMPLES, BATCH, EPOCHS = 61, 4, 2


def main() -> None:
    project, mode = sys.argv[2], sys.argv[3]
    stop_at = int(sys.argv[4]) if mode == "stop" else -1
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=2),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
    )
    set_seed(5)
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(
        torch.randn(SAMPLES, 5, generator=g), torch.randn(SAMPLES, 1, generator=g), torch.arange(SAMPLES)
    )
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    net, opt, loader = accelerator.prepare(net, opt, DataLoader(data, batch_size=BATCH, shuffle=True))
    if mode != "stop":
        accelerator.load_state()
    steps: list[list] = []
    while mode != "load" and loader.epoch < EPOCHS:
        epoch = loader.epoch
        for x, y, index in loader:
            loss = torch.nn.functional.mse_loss(net(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            steps.append([epoch, accelerator.gather_for_metrics(index).tolist()])
            accelerator.save_state()
            if len(steps) == stop_at:
                break
        if len(steps) == stop_at:
            break
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(net).parameters()])
    report({"world": accelerator.num_processes, "steps": steps, "weights": weights.tolist()})
    accelerator.end_training()


if __name__ == "__main__":
    main()
