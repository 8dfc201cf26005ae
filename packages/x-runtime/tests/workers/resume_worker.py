"""Trains with save_state after every step; can kill itself mid-run and resume from the latest save.

    resume_worker.py OUT PROJECT full       train to the end
    resume_worker.py OUT PROJECT crash K    SIGKILL this process (rank 0) after step K's save
    resume_worker.py OUT PROJECT resume     load the latest checkpoint, finish the run

The run shuffles, uses dropout and Adam with a scheduler, so the data position, every RNG, the
optimizer and the scheduler must all be restored for the weights to match bit for bit.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from _helpers import Counter, report
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, ProjectConfiguration, set_seed

EPOCHS = 3


def main() -> None:
    project, mode = sys.argv[2], sys.argv[3]
    crash_at = int(sys.argv[4]) if mode == "crash" else -1
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=2),
    )
    set_seed(11)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(40, 6, generator=g), torch.randn(40, 1, generator=g))
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    loader = DataLoader(data, batch_size=4, shuffle=True)
    net, opt, loader, sched = accelerator.prepare(net, opt, loader, sched)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)

    per_epoch = len(loader)
    if mode == "resume":
        accelerator.load_state()
    start_epoch, skip = divmod(counter.steps, per_epoch)
    for epoch in range(start_epoch, EPOCHS):
        active = accelerator.skip_first_batches(loader, skip) if epoch == start_epoch and skip else loader
        for x, y in active:
            loss = torch.nn.functional.mse_loss(net(x), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            counter.steps += 1
            accelerator.save_state()
            if counter.steps == crash_at and accelerator.is_main_process:
                os.kill(os.getpid(), signal.SIGKILL)
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(net).parameters()])
    checkpoints = sorted(os.listdir(os.path.join(project, "checkpoints")))
    report({"weights": weights.tolist(), "steps": counter.steps, "checkpoints": checkpoints, "lr": sched.get_last_lr()})
    accelerator.end_training()


if __name__ == "__main__":
    main()
