"""Train a small classifier with x_runtime; the same file runs on 1 CPU or N processes.

    python examples/train.py                            # one process
    x-launch --num_processes 2 examples/train.py        # two processes (gloo on CPU, nccl on GPUs)
    torchrun --nproc_per_node 2 examples/train.py       # without x-launch: same result

Each epoch prints the mean training loss and the accuracy on a held-out set, gathered from every
process with gather_for_metrics (exactly len(eval set) predictions, however it was sharded).
A checkpoint is saved after every epoch; the run then resumes from the one before last and checks
that it ends with the same weights as the uninterrupted run.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, ProjectConfiguration, set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    labels = (x[:, :5].sum(dim=1) > 0).long() + (x[:, 5] > 1).long()
    return TensorDataset(x, labels)


def train(project_dir: str, epochs: int, resume_from: str | None = None) -> torch.Tensor:
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=3)
    )
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_loader = DataLoader(make_data(1000, seed=1), batch_size=32, shuffle=True)
    eval_loader = DataLoader(make_data(301, seed=2), batch_size=64)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    start = 0
    if resume_from is not None:
        accelerator.load_state(resume_from)
        start = accelerator.save_iteration  # checkpoint_<n> holds epoch n
        accelerator.print(f"resumed from {resume_from}")
    for epoch in range(start, epochs):
        model.train()
        total, batches = torch.zeros((), device=accelerator.device), 0
        for x, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach()
            batches += 1
        mean_loss = accelerator.reduce(total / batches, reduction="mean").item()
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for x, labels in eval_loader:
                predictions, labels = accelerator.gather_for_metrics((model(x).argmax(-1), labels))
                correct += (predictions == labels).sum().item()
                seen += len(labels)
        accelerator.print(f"epoch {epoch}: loss {mean_loss:.4f}  eval accuracy {correct / seen:.3f} ({seen} samples)")
        accelerator.save_state()
    weights = torch.cat([p.detach().flatten().cpu() for p in accelerator.unwrap_model(model).parameters()])
    accelerator.end_training()
    return weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--project-dir", default="runs/train-example", help="checkpoints go under it (shared by ranks)")
    args = parser.parse_args()
    project = Path(args.project_dir)
    if os.environ.get("RANK", "0") == "0":
        for run in ("full", "resumed"):  # this example's own folders, from an earlier run
            shutil.rmtree(project / run, ignore_errors=True)
    full = train(f"{project}/full", args.epochs)
    before_last = f"{project}/full/checkpoints/checkpoint_{args.epochs - 2}"
    resumed = train(f"{project}/resumed", args.epochs, resume_from=before_last)
    if not torch.equal(full, resumed):
        raise SystemExit("resumed run diverged from the uninterrupted one")
    if os.environ.get("RANK", "0") == "0":
        print("resumed run ends with the same weights as the uninterrupted one")


if __name__ == "__main__":
    main()
