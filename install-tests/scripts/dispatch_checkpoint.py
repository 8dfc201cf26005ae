"""Save a real safetensors checkpoint, load it with load_checkpoint_and_dispatch over CPU and disk, compare.

Run by test_installs.py inside a venv holding only x-common, x-bigmodel and torch: prints one JSON
line with the plan and the largest output difference from the model the checkpoint came from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from x_bigmodel import init_empty_weights, load_checkpoint_and_dispatch


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))


def main(workdir: Path) -> None:
    torch.manual_seed(0)
    reference = make_model()
    checkpoint = workdir / "model.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(checkpoint))
    with init_empty_weights():
        model = make_model()
    # One Linear's weight and bias (16.25 KiB) fit in the CPU budget; the rest go to disk.
    model = load_checkpoint_and_dispatch(
        model, str(checkpoint), device_map="auto", max_memory={"cpu": "40KiB"}, offload_folder=str(workdir / "offload")
    )
    x = torch.randn(3, 64)
    with torch.no_grad():
        difference = (model(x) - reference(x)).abs().max().item()
    print(json.dumps({"device_map": model.hf_device_map, "max_abs_difference": difference}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
