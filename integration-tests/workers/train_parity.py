"""Train a small MLP on a fixed global batch; the result does not depend on the number of processes.

    x-launch --num_processes N --cpu train_parity.py OUT.safetensors [--epochs 4]

Every run sees the same global batches in the same order: ``split_batches=True`` cuts each batch
of 48 samples (divisible by 1, 2 and 3) between the processes, the shuffle order comes from the
prepared loader's seedable sampler (``use_seedable_sampler=True``: by default the draws are
Accelerate's, whose order depends on the number of processes), and DDP averages the per-rank mean losses' gradients, which is
the gradient of the mean over the whole batch. No dropout, no other randomness after the
initialisation. Rank 0 writes the final weights (``weights.<name>``) and the sample order of
every step (``order``: the dataset indices of each global batch, gathered from every rank).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, set_seed

GLOBAL_BATCH = 48
SAMPLES = 10 * GLOBAL_BATCH


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    accelerator = Accelerator(split_batches=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    # One write per line: the ranks share stdout, and print() writes the end of line separately.
    sys.stdout.write(f"rank {accelerator.process_index}: world size {accelerator.num_processes}\n")
    sys.stdout.flush()
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 1, generator=g)) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    index = torch.arange(SAMPLES)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(TensorDataset(x, y, index), batch_size=GLOBAL_BATCH, shuffle=True, drop_last=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    order, losses = [], []
    for _epoch in range(args.epochs):
        for xb, yb, ib in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            order.append(accelerator.gather(ib))
            losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    accelerator.print(f"steps {len(losses)}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    weights = accelerator.get_state_dict(model)
    result = {f"weights.{name}": tensor.detach().contiguous() for name, tensor in weights.items()}
    result["order"] = torch.stack(order)
    accelerator.save(result, args.out, safe_serialization=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
