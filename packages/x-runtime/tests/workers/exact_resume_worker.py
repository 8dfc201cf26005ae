"""Uninterrupted runs that save at several points, then runs resumed from each of those saves.

    exact_resume_worker.py OUT ROOT full      every case to the end, saving each point under ROOT
    exact_resume_worker.py OUT ROOT resume    every case and point: a new run that load_state()s it

Cases: how the run resumes (``use_stateful_dataloader``, or ``skip_first_batches``) x
``num_workers`` (0, 2) x what the shuffle draws from (the seedable sampler; the user's
``generator=``; torch's global RNG under ``use_seedable_sampler=False``). Saves: after epoch 0's
loop, after the first batch of epoch 1, on the last batch of epoch 1. The model has dropout, so a
single global-RNG draw taken or skipped shows in the weights, as does any change of data order.
The resumed runs run in a process of their own, after the one that saved.
"""

from __future__ import annotations

import faulthandler
import itertools
import sys
from pathlib import Path

import torch
from _helpers import Counter, report
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, set_seed

EPOCHS = 3
PATHS = ("stateful", "skip")
WORKERS = (0, 2)
SHUFFLES = ("seedable", "generator", "global")
POINTS = ("between", "mid", "last")


def cases() -> list[tuple[str, int, str]]:
    # The user's generator and the global RNG add no worker-specific draw: num_workers=0 is enough.
    return [
        (path, workers, shuffle)
        for path, workers, shuffle in itertools.product(PATHS, WORKERS, SHUFFLES)
        if shuffle == "seedable" or workers == 0
    ]


def build(path: str, workers: int, shuffle: str) -> tuple[Accelerator, torch.nn.Module, object, object, Counter]:
    config = DataLoaderConfiguration(
        use_stateful_dataloader=path == "stateful", use_seedable_sampler=shuffle != "global"
    )
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    set_seed(11)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(24, 6, generator=g), torch.randn(24, 1, generator=g))
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(5) if shuffle == "generator" else None
    loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=workers, generator=generator)
    net, opt, loader = accelerator.prepare(net, opt, loader)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return accelerator, net, opt, loader, counter


def train(case: tuple[str, int, str], root: Path, point: str | None) -> dict:
    """The whole run (``point`` None: saving at every point), or the rest of it from ``point``'s save."""
    path = case[0]
    accelerator, net, opt, loader, counter = build(*case)
    per_epoch = len(loader)
    folder = root / "-".join(map(str, case))
    saves = {per_epoch: "mid", 2 * per_epoch - 1: "last"}  # steps done before the save's batch
    if point is not None:
        accelerator.load_state(str(folder / point))
    start_epoch, skip = divmod(counter.steps, per_epoch)
    for epoch in range(start_epoch, EPOCHS):
        resuming = path == "skip" and epoch == start_epoch and skip
        for x, y in accelerator.skip_first_batches(loader, skip) if resuming else loader:
            done = counter.steps
            loss = torch.nn.functional.mse_loss(net(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            counter.steps += 1
            if point is None and done in saves:
                accelerator.save_state(str(folder / saves[done]))
        if point is None and epoch == 0:
            accelerator.save_state(str(folder / "between"))
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(net).parameters()])
    return {"weights": weights.tolist(), "steps": counter.steps}


def main() -> None:
    # A stuck rank (a fork under gloo's threads, a collective one rank missed) prints where it is.
    faulthandler.dump_traceback_later(150, exit=True)
    torch.set_num_threads(1)
    root, mode = Path(sys.argv[2]), sys.argv[3]
    found = {}
    for case in cases():
        name = "-".join(map(str, case))
        if mode == "full":
            found[name] = train(case, root, None)
        else:
            for point in POINTS:
                found[f"{name}@{point}"] = train(case, root, point)
    report(found)


if __name__ == "__main__":
    main()
