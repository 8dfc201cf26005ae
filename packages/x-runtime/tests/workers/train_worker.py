"""Trains small models under x_runtime in several configurations and reports final weights.

Run with 1, 2 or 3 processes; the test compares the reports. Every configuration starts from
the same seeded model and data, so any difference comes from how the work was split.
"""

from __future__ import annotations

import sys

import torch
from _helpers import report
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, set_seed

GLOBAL_BATCH = 12
DATA = 36
CPU = "--gpu" not in sys.argv  # GPU runs: one device per process, nccl


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(DATA, 4, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(DATA, generator=g)).unsqueeze(1)
    return TensorDataset(x, y)


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def flat(m: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().double().flatten() for p in m.parameters()]).tolist()


def train(*, split_batches=False, accumulation=1, shuffle=False, mixed_precision="no", epochs=2, optimizer="sgd"):
    accelerator = Accelerator(
        cpu=CPU,
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=accumulation,
        # one permutation whatever the world size: the seedable sampler (x's, asked for)
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches, use_seedable_sampler=True),
    )
    set_seed(5)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05) if optimizer == "sgd" else torch.optim.Adam(net.parameters(), 1e-2)
    per_step = GLOBAL_BATCH if split_batches else GLOBAL_BATCH // accelerator.num_processes
    loader = DataLoader(data(), batch_size=per_step // accumulation, shuffle=shuffle)
    net, opt, loader = accelerator.prepare(net, opt, loader)
    steps = 0
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(net):
                loss = torch.nn.functional.mse_loss(net(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    steps += 1
                opt.step()
                opt.zero_grad()
    return flat(accelerator.unwrap_model(net).cpu()), steps


def plain_reference(epochs=2) -> list[float]:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(epochs):
        for x, y in DataLoader(data(), batch_size=GLOBAL_BATCH):
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return flat(net)


def metrics(size: int, batch: int, even_batches: bool = True) -> list[int]:
    accelerator = Accelerator(cpu=CPU, dataloader_config=DataLoaderConfiguration(even_batches=even_batches))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(size)), batch_size=batch))
    seen = []
    for (ids,) in loader:
        seen.extend(accelerator.gather_for_metrics(ids).cpu().tolist())
    objects = []
    for (ids,) in loader:
        objects.extend(accelerator.gather_for_metrics([f"s{i}" for i in ids.tolist()], use_gather_object=True))
    return seen, objects


def main() -> None:
    results = {
        "world": Accelerator(cpu=CPU).num_processes,
        "ddp": train(),
        "split": train(split_batches=True),
        "accumulate": train(accumulation=2),
        "accumulate_split": train(accumulation=2, split_batches=True),
        "shuffle": train(shuffle=True, optimizer="adam"),
        "bf16": train(mixed_precision="bf16"),
        "metrics": {f"{size}/{batch}": metrics(size, batch) for size, batch in ((12, 2), (10, 2), (11, 3), (5, 4))},
    }
    if results["world"] == 1:
        results["plain"] = plain_reference()
    report(results)


if __name__ == "__main__":
    sys.exit(main())
