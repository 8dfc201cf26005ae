"""`x-launch merge-weights`, as `accelerate merge-weights`: a real sharded checkpoint in, one file out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

X_LAUNCH = str(Path(sys.executable).with_name("x-launch"))


def _sharded_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    # What save_fsdp_model writes: a torch.distributed.checkpoint folder holding {"model": ...}.
    torch.manual_seed(0)
    weights = {"layer.weight": torch.randn(4, 3), "layer.bias": torch.randn(4)}
    dcp.save({"model": weights}, checkpoint_id=str(folder))
    return weights


def test_merge_weights_writes_the_whole_model_as_safetensors(tmp_path: Path, launch_env) -> None:
    weights = _sharded_checkpoint(tmp_path / "pytorch_model_fsdp_0")
    done = subprocess.run(
        [X_LAUNCH, "merge-weights", str(tmp_path / "pytorch_model_fsdp_0"), str(tmp_path / "out")],
        env=launch_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    merged = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(merged) == sorted(weights)
    assert all(torch.equal(merged[k], weights[k]) for k in weights)


def test_merge_weights_of_a_folder_that_is_no_checkpoint_is_one_line(tmp_path: Path, launch_env) -> None:
    (tmp_path / "ckpt").mkdir()
    done = subprocess.run(
        [X_LAUNCH, "merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "out")],
        env=launch_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "no .metadata" in done.stderr
    assert not (tmp_path / "out").exists()
