"""On CUDA devices: placement, fp16 loss scaling, bf16, and nccl training parity (skipped without GPUs)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, GradScalerKwargs


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
    # The default first scale (2**16) overflows fp16 gradients of this loss now and then, and the
    # first step is then skipped, as it is under Accelerate (seen on an H200): start lower.
    torch.manual_seed(0)
    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=2.0**10)])
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


_PARITY_SCRIPT = """
import json, sys
import torch
from {module} import Accelerator

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
accelerator = Accelerator(mixed_precision=sys.argv[1], gradient_accumulation_steps=2)
model, optimizer = accelerator.prepare(model, optimizer)
data = torch.randn(12, 8, 16, generator=torch.Generator().manual_seed(1))
losses = []
for batch in data:
    with accelerator.accumulate(model):
        loss = model(batch.to(accelerator.device)).float().pow(2).mean()
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    losses.append(loss.item())
weights = [p.detach().float().cpu().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
print(json.dumps({{"losses": losses, "weights": weights}}))
"""


@pytest.mark.requires_cuda(1)
@pytest.mark.parametrize("precision", ["no", "fp16", "bf16"])
def test_gpu_training_matches_accelerate(precision: str, tmp_path) -> None:
    """The same loop (autocast, loss scaling, accumulation, clipping) on one GPU under x and under Accelerate."""
    import subprocess
    import sys

    pytest.importorskip("accelerate")
    results = {}
    for module in ("x_runtime", "accelerate"):
        script = tmp_path / f"parity_{module}.py"
        script.write_text(_PARITY_SCRIPT.format(module=module))
        done = subprocess.run([sys.executable, str(script), precision], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        results[module] = json.loads(done.stdout.strip().splitlines()[-1])
    ours, theirs = results["x_runtime"], results["accelerate"]
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-5, abs=1e-6)
    for mine, other in zip(ours["weights"], theirs["weights"], strict=True):
        assert mine == pytest.approx(other, rel=1e-5, abs=1e-6)


@pytest.mark.requires_cuda(1)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gpu_resume_is_exact(precision: str, tmp_path) -> None:
    """save_state mid-run on a GPU (dropout's CUDA RNG, the fp16 scaler), load_state: the same weights as never stopping."""

    def build() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        accelerator = Accelerator(mixed_precision=precision)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        return accelerator, model, optimizer

    def train(accelerator, model, optimizer, steps: int) -> None:
        for _ in range(steps):
            x = torch.randn(16, 8, device=accelerator.device)
            accelerator.backward(model(x).float().pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()

    accelerator, model, optimizer = build()
    train(accelerator, model, optimizer, 3)
    accelerator.save_state(tmp_path / "ckpt")
    train(accelerator, model, optimizer, 4)
    straight = [p.detach().clone() for p in model.parameters()]

    accelerator, model, optimizer = build()
    accelerator.load_state(tmp_path / "ckpt")
    train(accelerator, model, optimizer, 4)
    for resumed, expected in zip(model.parameters(), straight, strict=True):
        assert resumed.device.type == "cuda"
        assert torch.equal(resumed.detach(), expected)
