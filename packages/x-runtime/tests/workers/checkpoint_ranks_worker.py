"""save_state / load_state on real processes: per-rank folders, and a failure on one rank.

Usage (under torchrun): ``checkpoint_ranks_worker.py OUT_DIR MODE`` with MODE ``per_rank`` (each
rank saves into its own folder, then resumes from it) or ``fail`` (rank 1's writes fail during a save into one shared
folder, then rank 1 loads from a folder that does not exist). Each rank reports what it saw and
how long the failing calls took to raise.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from _helpers import rank, report

import x_runtime.checkpoint.checkpointing as checkpointing
from x_runtime import Accelerator


def timed(call) -> dict:
    start = time.monotonic()
    try:
        call()
        return {"ok": True, "seconds": time.monotonic() - start}
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    results: dict = {}
    if mode == "per_rank":
        folder = out / f"node{rank()}" / "ckpt"
        folder.parent.mkdir(parents=True, exist_ok=True)
        results["save"] = timed(lambda: accelerator.save_state(str(folder)))
        results["files"] = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None
        results["save_again"] = timed(lambda: accelerator.save_state(str(folder)))
        # Each rank resumes from its own folder: the weights it saved come back.
        saved = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        results["load"] = timed(lambda: accelerator.load_state(str(folder)))
        results["restored"] = all(torch.equal(a, b) for a, b in zip(saved, model.parameters(), strict=True))
    else:
        shared = out / "shared"
        real_save = checkpointing.torch_save

        def failing_save(obj, path):
            if rank() == 1 and Path(path).name.startswith("random_states"):
                raise OSError("injected: disk full")
            return real_save(obj, path)

        checkpointing.torch_save = failing_save
        results["save"] = timed(lambda: accelerator.save_state(str(shared)))
        checkpointing.torch_save = real_save
        results["save_ok"] = timed(lambda: accelerator.save_state(str(shared)))
        source = shared if rank() == 0 else out / "missing"
        results["load"] = timed(lambda: accelerator.load_state(str(source)))
        results["after"] = timed(accelerator.wait_for_everyone)
    report(results, str(out))


if __name__ == "__main__":
    main()
