"""A small DDP job on CPU that gets stuck in a chosen way, for the stall watchdog's tests.

``--mode``: ``ok`` (trains and ends), ``sleep`` (rank 1 sleeps ``--hang`` seconds at step 3), ``skip`` (rank 1 skips
the last step's loss all-reduce and waits at the end, where rank 0 is still in that all-reduce), ``loader`` (rank 1's DataLoader worker hangs on one sample), ``recv``
(rank 1 blocks in a gloo receive nobody sends), ``slow`` (each step takes ``--pace`` seconds of
work spread over micro-batches), ``straggler`` (rank 1 does ``--pace`` seconds of extra work per step).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from x_runtime import Accelerator

STUCK = 3  # the step at which a rank gets stuck


class Samples(Dataset):
    def __init__(self, hang_on: int | None) -> None:
        self.hang_on = hang_on

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.hang_on:
            time.sleep(600)  # the stuck sample
        return torch.full((4,), float(index)), torch.ones(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--hang", type=float, default=600.0, help="seconds rank 1 sleeps with --mode sleep")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3 if args.mode == "slow" else 1)
    rank = accelerator.process_index
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    hang_on = STUCK if args.mode == "loader" and rank == 1 else None
    loader = DataLoader(Samples(hang_on), batch_size=1, num_workers=1 if args.mode == "loader" else 0)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        if args.mode == "sleep" and rank == 1 and step == STUCK:
            time.sleep(args.hang)  # the stuck rank
        if args.mode == "recv" and rank == 1 and step == STUCK:
            dist.recv(torch.zeros(1), src=0)  # nobody sends
        if args.mode == "straggler" and rank == 1:
            time.sleep(args.pace)
        with accelerator.accumulate(model):
            if args.mode == "slow":
                time.sleep(args.pace / 3)
            loss = ((model(x) - y) ** 2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if not (args.mode == "skip" and rank == 1 and step == args.steps - 1):
            accelerator.reduce(loss.detach(), reduction="mean")  # rank 1 skips the last one
    accelerator.wait_for_everyone()
    accelerator.print("done")


if __name__ == "__main__":
    main()
