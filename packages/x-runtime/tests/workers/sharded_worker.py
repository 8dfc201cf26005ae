"""Trains a small layer-stacked model; FSDP, DeepSpeed or plain is decided by the launcher variables.

    sharded_worker.py OUT PROJECT SAVE_AT STOP_AT [resume]

Saves a checkpoint at micro-step SAVE_AT (0: never) into PROJECT/ckpt, stops after STOP_AT
micro-steps (0: run all epochs), or first loads PROJECT/ckpt and continues when "resume" is
given. Rank 0 reports the whole model's weights (gathered), what the checkpoint folder holds,
and how the model was sharded; every rank reports its parameter types.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from _helpers import Counter, report
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, set_seed

EPOCHS = 2


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    _no_split_modules = ("Block",)

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.blocks = nn.ModuleList(Block(16) for _ in range(3))
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def main() -> None:
    project = Path(sys.argv[2])
    save_at, stop_at = int(sys.argv[3]), int(sys.argv[4])
    resume = len(sys.argv) > 5 and sys.argv[5] == "resume"
    # The seedable sampler: one shuffled order for every world size, so 2 processes train as 1 does.
    config = DataLoaderConfiguration(split_batches=True, use_seedable_sampler=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, dataloader_config=config)
    set_seed(5)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(96, 6, generator=g), torch.randn(96, 1, generator=g))
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
    loader = DataLoader(data, batch_size=8, shuffle=True)
    net, opt, loader, sched = accelerator.prepare(net, opt, loader, sched)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    if resume:
        accelerator.load_state(project / "ckpt")
    start_epoch, skip = divmod(counter.steps, len(loader))
    losses = []
    for epoch in range(start_epoch, EPOCHS):
        active = accelerator.skip_first_batches(loader, skip) if epoch == start_epoch and skip else loader
        for x, y in active:
            with accelerator.accumulate(net):
                loss = nn.functional.mse_loss(net(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(net.parameters(), 0.5)
                opt.step()
                sched.step()
                opt.zero_grad()
            losses.append(loss.item())
            counter.steps += 1
            if counter.steps == save_at:
                accelerator.save_state(project / "ckpt")
            if counter.steps == stop_at:
                break
        if counter.steps == stop_at:
            break
    try:
        weights = accelerator.get_state_dict(net)
        accelerator.save_model(net, project / "final")
        refused = None
    except ValueError as exc:  # ZeRO-3 without stage3_gather_16bit_weights_on_model_save, as Accelerate refuses
        weights, refused = {}, str(exc)
    first = next(iter(accelerator.unwrap_model(net).parameters()))
    ckpt = project / "ckpt"
    data_out = {
        "distributed_type": str(accelerator.distributed_type),
        "state_dict_refused": refused,
        "param_type": type(first).__name__,
        "local_numel": int(first.to_local().numel()) if hasattr(first, "to_local") else int(first.numel()),
        "steps": counter.steps,
        "losses": losses,
        "checkpoint_files": sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else [],
        "sharded_files": sorted(p.name for p in (ckpt / "model_sharded").iterdir())
        if (ckpt / "model_sharded").is_dir()
        else [],
        "units": sorted(
            name for name, m in accelerator.unwrap_model(net).named_modules() if type(m).__name__.startswith("FSDP")
        ),
        "ranks": int(os.environ.get("WORLD_SIZE", "1")),
    }
    if accelerator.is_main_process:
        data_out["weights"] = {k: v.detach().flatten().tolist() for k, v in weights.items()}
    report(data_out)
    accelerator.end_training()


if __name__ == "__main__":
    main()
