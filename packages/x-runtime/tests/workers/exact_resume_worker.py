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
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO

import torch
from _helpers import Counter, rank, report
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, set_seed

EPOCHS = 3
# Seconds; a whole launch takes well under 15 on two cores (a loop hunting a hang sets less).
HANG_AFTER = float(os.environ.get("EXACT_RESUME_HANG_AFTER", "150"))
PATHS = ("stateful", "skip")
WORKERS = (0, 2)
SHUFFLES = ("seedable", "generator", "global")
POINTS = ("between", "mid", "last")
_STACKS: list[IO[str]] = []  # this rank's stack file (dump_stacks_on_hang), kept open for faulthandler
_T0 = time.monotonic()


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
    note(f"{folder.name}@{point or 'full'}: {per_epoch} batches/epoch, from step {counter.steps}")
    for epoch in range(start_epoch, EPOCHS):
        resuming = path == "skip" and epoch == start_epoch and skip
        for x, y in accelerator.skip_first_batches(loader, skip) if resuming else loader:
            done = counter.steps
            note(f"  epoch {epoch} step {done}")
            loss = torch.nn.functional.mse_loss(net(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            counter.steps += 1
            if point is None and done in saves:
                accelerator.save_state(str(folder / saves[done]))
        if point is None and epoch == 0:
            accelerator.save_state(str(folder / "between"))
    note(f"  done: {counter.steps} steps")
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(net).parameters()])
    return {"weights": weights.tolist(), "steps": counter.steps}


def note(text: str) -> None:
    """A progress line in this rank's stack file: where each rank got to, next to where it stopped."""
    for stacks in _STACKS:
        stacks.write(f"{time.monotonic() - _T0:7.1f}s {text}\n")
        stacks.flush()  # before faulthandler writes to the same descriptor


def note_children() -> None:
    """A line per child process (DataLoader workers): one still named ``python`` never got past fork.

    torch names a worker ``pt_data_worker`` as its loop starts. On CPython < 3.12 a fork can
    deadlock the child inside ``os.fork`` (python/cpython#112275: another thread, here one of
    gloo's, was creating a Python thread state at that instant), and its rank waits for its batch
    forever while the other rank waits in DDP's all-reduce.
    """
    me = os.getpid()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) != me:
                continue
            name, waits = (proc / "comm").read_text().strip(), (proc / "wchan").read_text()
        except (OSError, ValueError, IndexError):
            continue
        note(f"child {proc.name}: {name}, waiting in {waits}")


def dump_stacks_on_hang(out: Path) -> None:
    """A stuck rank (a fork under gloo's threads, a collective one rank missed) writes where it is.

    Every rank writes to ``OUT/stacks-rank<RANK>.txt`` (the test prints the files when a launch
    fails) a line per case and step (``note``), then its threads' stacks: after ``HANG_AFTER``
    seconds (with its child processes just before, ``note_children``), exiting; or when torchrun
    ends it with SIGTERM because another rank exited first (that rank's stack used to be lost).
    Two ranks' last lines show a step-count mismatch; a stack in the same place on both, a slow
    run rather than a stuck one.
    """
    stacks = open(out / f"stacks-rank{rank()}.txt", "w")  # noqa: SIM115 - open for faulthandler until exit
    _STACKS.append(stacks)
    faulthandler.dump_traceback_later(HANG_AFTER, exit=True, file=stacks)
    children = threading.Timer(max(HANG_AFTER - 3, 0), note_children)  # just before the stacks
    children.daemon = True
    children.start()
    faulthandler.register(signal.SIGTERM, file=stacks, all_threads=True, chain=True)
    # A forked DataLoader worker has no timer thread; its SIGTERM (a shutdown) stays the default.
    os.register_at_fork(after_in_child=lambda: faulthandler.unregister(signal.SIGTERM))


def main() -> None:
    root, mode = Path(sys.argv[2]), sys.argv[3]
    dump_stacks_on_hang(Path(sys.argv[1]))
    torch.set_num_threads(1)
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
