"""``register_save_state_pre_hook`` / ``register_load_state_pre_hook``: hooks see the folder being written
(their files land in the checkpoint), and a model they take over gets no weights file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from x_runtime import Accelerator


def _prepared(seed: int = 0) -> tuple[Accelerator, torch.nn.Module, torch.nn.Module]:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(seed)
    first, second = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    first, second = accelerator.prepare(first, second)
    return accelerator, first, second


def test_hooks_write_into_the_checkpoint_and_read_it_back(tmp_path: Path) -> None:
    accelerator, first, _second = _prepared()
    seen: list[tuple] = []

    def save_hook(models: list, weights: list, output_dir: str) -> None:
        seen.append((len(models), sorted(weights[0]), output_dir))
        with open(os.path.join(output_dir, "config.json"), "w") as f:
            json.dump({"name": type(models[0]).__name__}, f)

    def load_hook(models: list, input_dir: str) -> None:
        with open(os.path.join(input_dir, "config.json")) as f:
            models[0].loaded_name = json.load(f)["name"]

    save_handle = accelerator.register_save_state_pre_hook(save_hook)
    load_handle = accelerator.register_load_state_pre_hook(load_hook)
    target = tmp_path / "ckpt"
    accelerator.save_state(target)
    assert seen[0][:2] == (2, ["bias", "weight"])
    assert seen[0][2] != str(target)  # the folder being assembled, renamed into place once complete
    assert json.loads((target / "config.json").read_text()) == {"name": "Linear"}

    expected = first.weight.detach().clone()
    with torch.no_grad():
        first.weight.zero_()
    accelerator.load_state(target)
    assert first.loaded_name == "Linear" and torch.equal(first.weight, expected)

    save_handle.remove()
    load_handle.remove()
    accelerator.save_state(tmp_path / "plain")
    assert len(seen) == 1 and not (tmp_path / "plain" / "config.json").exists()


def test_weights_a_hook_takes_are_not_written_nor_loaded(tmp_path: Path) -> None:
    accelerator, first, second = _prepared()

    def save_first_itself(models: list, weights: list, output_dir: str) -> None:
        torch.save(weights.pop(0), os.path.join(output_dir, "first.pt"))

    def load_first_itself(models: list, input_dir: str) -> None:
        models.pop(0).load_state_dict(torch.load(os.path.join(input_dir, "first.pt")))

    accelerator.register_save_state_pre_hook(save_first_itself)
    accelerator.register_load_state_pre_hook(load_first_itself)
    accelerator.save_state(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "x_checkpoint.json").read_text())
    assert manifest["models"] == 1 and (tmp_path / "ckpt" / "first.pt").is_file()

    first_weight, second_weight = first.weight.detach().clone(), second.weight.detach().clone()
    with torch.no_grad():
        first.weight.zero_()
        second.weight.zero_()
    accelerator.load_state(tmp_path / "ckpt")  # model_0's file holds the second model's weights
    assert torch.equal(first.weight, first_weight) and torch.equal(second.weight, second_weight)


def test_a_failing_save_hook_leaves_no_checkpoint(tmp_path: Path) -> None:
    accelerator, _first, _second = _prepared()

    def broken(models: list, weights: list, output_dir: str) -> None:
        raise OSError("hook cannot write")

    accelerator.register_save_state_pre_hook(broken)
    with pytest.raises(OSError, match="hook cannot write"):
        accelerator.save_state(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
