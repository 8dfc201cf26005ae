"""save_state(async_save=True) on real processes (gloo): resume, kill, and background errors.

    async_save_worker.py OUT ROOT full     train STEPS steps, saving asynchronously after SAVE_AT
    async_save_worker.py OUT ROOT resume   load that checkpoint, train the remaining steps
    async_save_worker.py OUT ROOT kill     save, then save again asynchronously and wait to be killed
    async_save_worker.py OUT ROOT error    a background write that fails on rank 0 only
    async_save_worker.py OUT DISK disk_full   a background write that fills DISK (a small tmpfs)

Each rank reports per-tensor SHA-256 digests, so weights compare exactly across launches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from _helpers import rank, report
from safetensors.torch import load_file

from x_runtime import Accelerator

STEPS, SAVE_AT, WIDTH, LAYERS = 6, 3, 1536, 4  # ~9.4M parameters: ~113 MB with Adam's moments


def digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    return {k: hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest() for k, v in tensors.items()}


def setup() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def step(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, index: int) -> None:
    data = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(100 * index + rank()))
    accelerator.backward(model(data).square().mean())
    optimizer.step()
    optimizer.zero_grad()


class Unwritable:
    """A registered object whose state torch.save cannot pickle (on rank 0, the folder's writer)."""

    def state_dict(self) -> dict:
        return {"callback": (lambda: 0) if rank() == 0 else None}

    def load_state_dict(self, state: dict) -> None:
        pass


class Blob:
    """Registered state the free-space check does not count (as in checkpoint_disk_full_worker)."""

    def state_dict(self) -> dict:
        return {"data": torch.zeros(64 * 1024 // 4)}

    def load_state_dict(self, state: dict) -> None:
        pass


def disk_full(out: Path, disk: Path) -> None:
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(64, 64))
    accelerator.register_for_checkpointing(Blob())
    accelerator.save_state(disk / "ckpt")
    first = digests(accelerator.unwrap_model(model).state_dict())
    with torch.no_grad():
        accelerator.unwrap_model(model).weight.add_(1)
    if rank() == 0:  # room for the weights (the check passes), not for the blob written after them
        with open(disk / "filler", "wb") as handle:
            handle.write(b"\0" * (shutil.disk_usage(disk).free - 48 * 1024))
    accelerator.wait_for_everyone()
    found: dict = {}
    accelerator.save_state(disk / "ckpt", async_save=True)
    found["returned"] = True
    try:
        accelerator.wait_for_checkpoint()
    except Exception as error:  # every rank: DiskFullError, or RuntimeError naming it with another rank's
        found["raised"] = {"type": type(error).__name__, "message": str(error)}
    accelerator.load_state(disk / "ckpt")
    found["ckpt_is_first"] = digests(accelerator.unwrap_model(model).state_dict()) == first
    found["leftovers"] = sorted(p.name for p in disk.iterdir() if p.name.startswith("."))
    report(found, str(out))


def main() -> None:
    out, root, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    if mode == "disk_full":
        disk_full(out, root)
        return
    accelerator, model, optimizer = setup()
    weights = accelerator.unwrap_model(model)
    found: dict = {}
    if mode == "full":
        for index in range(STEPS):
            step(accelerator, model, optimizer, index)
            if index == SAVE_AT - 1:
                at_save = {k: v.clone() for k, v in weights.state_dict().items()}
                accelerator.save_state(root / "ckpt", async_save=True)
                found["returned_before_written"] = not (root / "ckpt" / "x_checkpoint.json").exists()
        accelerator.end_training()  # waits for the write
        written = load_file(root / "ckpt" / "model.safetensors")
        found["written_is_snapshot"] = digests(written) == digests(at_save)
        found["written_is_final"] = digests(written) == digests(weights.state_dict())
    elif mode == "resume":
        accelerator.load_state(root / "ckpt")
        for index in range(SAVE_AT, STEPS):
            step(accelerator, model, optimizer, index)
    elif mode == "kill":
        step(accelerator, model, optimizer, 0)
        accelerator.save_state(root / "ckpt")
        if rank() == 0:
            torch.save(dict(weights.state_dict()), out / "first.pt")
        accelerator.wait_for_everyone()
        step(accelerator, model, optimizer, 1)
        accelerator.save_state(root / "ckpt", async_save=True)
        # The test kills the ranks by these ids now, mid-write (torchrun puts them in sessions of their own).
        (out / f".pid{rank()}").write_text(str(os.getpid()))
        (out / f".pid{rank()}").rename(out / f"returned{rank()}")
        time.sleep(120)
    elif mode == "error":
        accelerator.save_state(root / "ckpt")
        first = digests(weights.state_dict())
        accelerator.register_for_checkpointing(Unwritable())
        step(accelerator, model, optimizer, 0)
        accelerator.save_state(root / "ckpt", async_save=True)  # returns: the failure is in the thread
        found["returned"] = True
        try:
            accelerator.save_state(root / "other")
        except Exception as error:  # the background write's failure, raised here on every rank
            found["raised"] = f"{type(error).__name__}: {error}"
        found["other_exists"] = (root / "other").exists()
        found["ckpt_is_first"] = digests(load_file(root / "ckpt" / "model.safetensors")) == first
        accelerator.end_training()  # nothing pending any more: ends normally
    found["final"] = digests(weights.state_dict())
    report(found, str(out))


if __name__ == "__main__":
    main()
