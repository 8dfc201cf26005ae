"""On CUDA devices: placement, fp16 loss scaling, bf16, and nccl training parity (skipped without GPUs)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator


@pytest.mark.requires_cuda(1)
def test_model_batches_and_optimizer_state_land_on_the_gpu() -> None:
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()  # state created on the CPU, before prepare
    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert accelerator.device.type == "cuda" and model.weight.device.type == "cuda"
    assert all(state["exp_avg"].device.type == "cuda" for state in optimizer.state.values())
    assert all(batch[0].device.type == "cuda" for batch in loader)


@pytest.mark.requires_cuda(1)
def test_fp16_training_steps_and_overflow_skip() -> None:
    accelerator = Accelerator(mixed_precision="fp16")
    model = torch.nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(8, 4, device=accelerator.device)
    accelerator.backward(model(x).pow(2).mean())
    before = model.weight.detach().clone()
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped and not torch.equal(before, model.weight)
    optimizer.zero_grad()
    accelerator.backward(model(x).pow(2).mean())
    model.weight.grad[0, 0] = float("inf")
    before = model.weight.detach().clone()
    optimizer.step()
    assert accelerator.optimizer_step_was_skipped and torch.equal(before, model.weight)


@pytest.mark.requires_cuda(2)
def test_two_gpus_train_like_one(launch, tmp_path) -> None:
    reports = {}
    for nprocs in (1, 2):
        out = tmp_path / str(nprocs)
        out.mkdir()
        launch("train_worker.py", nprocs, str(out), "--gpu")
        reports[nprocs] = json.loads((out / "rank0.json").read_text())
    for case in ("ddp", "split", "accumulate"):
        one, two = torch.tensor(reports[1][case][0]), torch.tensor(reports[2][case][0])
        assert torch.allclose(one, two, atol=1e-5), case
    assert reports[2]["metrics"] == reports[1]["metrics"]
