"""Train a small model under Accelerate or x; save_state at one step, or resume from that folder.

    accelerate_resume_worker.py <out_dir> <framework: accelerate|x> <mode: save|resume> <ckpt> <shuffle> <noise> [save_at]

``save`` trains all ``STEPS`` steps and calls ``save_state(ckpt)`` after step ``SAVE_AT`` (7 unless given; so its
final weights are the uninterrupted run's); ``resume`` builds the same objects in a fresh process,
``load_state(ckpt)``, skips the batches already seen (``skip_first_batches``, as Accelerate's
examples resume) and finishes. Each rank writes its final weights to
``<out_dir>/<framework>-<mode>-rank<r>.pt`` and ``rank<r>.json`` (steps, accelerator step, counter).
The script is the same for both frameworks but for its two imports.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import torch
from _helpers import Counter, rank, report
from torch.utils.data import DataLoader, TensorDataset

out_dir, framework, mode, ckpt, shuffle, noise = sys.argv[1:7]
SAVE_AT = int(sys.argv[7]) if len(sys.argv) > 7 else 7
if framework == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed
else:
    from x_runtime import Accelerator, DataLoaderConfiguration, set_seed

STEPS = 18

set_seed(0)
# No dropout: the only draws from the global generator are the noise below (and a shuffle).
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
data = TensorDataset(torch.randn(48, 4), torch.randn(48, 1))
loader = DataLoader(data, batch_size=4, shuffle=shuffle != "0")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
counter = Counter()
# shuffle "seedable": the order comes from (seed, epoch) alone, the same under both frameworks.
config = DataLoaderConfiguration(use_seedable_sampler=shuffle == "seedable")
accelerator = Accelerator(cpu=True, dataloader_config=config)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
accelerator.register_for_checkpointing(counter)


def peek() -> list[float]:
    """The next draw of Python's, NumPy's and torch's generators, leaving them where they were."""
    python, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    found = [random.random(), float(np.random.rand()), torch.rand(1).item()]
    random.setstate(python), np.random.set_state(numpy_state), torch.set_rng_state(torch_state)
    return found


draws: list[float] = []
step = 0
if mode == "resume":
    accelerator.load_state(ckpt)
    step = SAVE_AT
    assert counter.steps == SAVE_AT, counter.steps
    draws = peek()
epoch, skip = divmod(step, len(loader))
while step < STEPS:
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    batches = accelerator.skip_first_batches(loader, skip) if skip else loader
    for inputs, targets in batches:
        # A draw from the restored global generator every step: RNG states must come back exactly.
        noisy = inputs + 0.01 * torch.randn_like(inputs) if noise == "1" else inputs
        loss = torch.nn.functional.mse_loss(model(noisy), targets)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        counter.steps += 1
        if mode == "save" and step == SAVE_AT:
            accelerator.save_state(ckpt)
            draws = peek()
        if step == STEPS:
            break
    skip, epoch = 0, epoch + 1

weights = {k: v.detach().cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
torch.save(weights, Path(out_dir) / f"{framework}-{mode}-rank{rank()}.pt")
report({"steps": step, "counter": counter.steps, "lr": scheduler.get_last_lr()[0], "draws": draws}, out_dir)
if framework == "accelerate" and torch.distributed.is_initialized():
    # Accelerate leaves the gloo group to interpreter exit, where it sometimes aborts the process
    # ("terminate called without an active exception"); x leaves it cleanly at exit itself.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
