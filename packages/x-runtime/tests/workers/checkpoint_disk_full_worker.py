"""save_state on a disk that fills, on real processes (torchrun, gloo).

Usage: ``checkpoint_disk_full_worker.py OUT_DIR DISK`` where DISK is an empty small tmpfs. Two
scenarios, one after the other:

- ``mid_write``: both ranks save into one folder, then rank 0 fills the disk so the next save
  passes the free-space check but runs out while rank 0 writes a registered object whose size
  cannot be foreseen; afterwards every rank loads the first checkpoint back.
- ``together``: each rank saves into its own folder on the same disk; either would fit alone,
  both together do not, so the save is refused before anything is written.

Each rank reports the error type, errno and message it saw, what the disk holds afterwards and
whether the previous checkpoint gave back its weights.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from _helpers import rank, report

from x_runtime import Accelerator


class Blob:
    """Registered state: its bytes are known only once written, so no free-space check sees them."""

    def __init__(self) -> None:
        self.data = torch.zeros(64 * 1024 // 4)

    def state_dict(self) -> dict:
        return {"data": self.data}

    def load_state_dict(self, state: dict) -> None:
        self.data = state["data"]


def attempt(call) -> dict:
    try:
        call()
        return {"ok": True}
    except Exception as error:
        return {"type": type(error).__name__, "errno": getattr(error, "errno", None), "message": str(error)}


def leftovers(disk: Path) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if "partial" in p.name)


def main() -> None:
    torch.set_num_threads(1)
    out, disk = Path(sys.argv[1]), Path(sys.argv[2])
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(Blob())

    def step() -> None:
        accelerator.backward(model(torch.ones(2, 64)).sum())
        optimizer.step()
        optimizer.zero_grad()

    results: dict = {}
    step()
    shared = disk / "shared" / "ckpt"
    accelerator.save_state(str(shared))
    saved = [p.detach().clone() for p in model.parameters()]
    step()
    if rank() == 0:
        free = shutil.disk_usage(disk).free
        with open(disk / "filler", "wb") as handle:
            handle.write(b"\0" * (free - 96 * 1024))
    accelerator.wait_for_everyone()
    results["free_before"] = shutil.disk_usage(disk).free
    accelerator.wait_for_everyone()  # read before any rank's save writes its first file
    results["mid_write"] = attempt(lambda: accelerator.save_state(str(shared)))
    accelerator.wait_for_everyone()
    results["free_after"] = shutil.disk_usage(disk).free
    results["leftovers_mid_write"] = leftovers(disk)
    results["load"] = attempt(lambda: accelerator.load_state(str(shared)))
    results["restored"] = all(torch.equal(a, b) for a, b in zip(saved, model.parameters(), strict=True))
    accelerator.wait_for_everyone()

    # Together: one folder per rank on the same disk; room for one rank's weights, not for two.
    if rank() == 0:
        (disk / "filler").unlink()
        shutil.rmtree(disk / "shared")
        free = shutil.disk_usage(disk).free
        with open(disk / "filler", "wb") as handle:
            handle.write(b"\0" * (free - 72 * 1024))
    accelerator.wait_for_everyone()
    own = disk / f"rank{rank()}" / "ckpt"
    results["together_free"] = shutil.disk_usage(disk).free
    accelerator.wait_for_everyone()  # read before any rank's save writes its first file
    results["together"] = attempt(lambda: accelerator.save_state(str(own)))
    accelerator.wait_for_everyone()
    results["together_free_after"] = shutil.disk_usage(disk).free
    results["leftovers_together"] = leftovers(disk)
    report(results, str(out))


if __name__ == "__main__":
    main()
