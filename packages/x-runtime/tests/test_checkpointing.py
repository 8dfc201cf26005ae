"""save_state / load_state / save_model in one process: files on disk, round trips, crashes."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, ProjectConfiguration
from x_runtime.checkpoint import checkpointing
from x_runtime.io.model_files import load_state_dict_files


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(ids)))


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def _setup(project=None, **config):
    accelerator = Accelerator(
        cpu=True, project_config=ProjectConfiguration(project_dir=project, **config) if project else None
    )
    torch.manual_seed(0)
    model = Tied()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
    loader = DataLoader(TensorDataset(torch.arange(20) % 10), batch_size=4, shuffle=True)
    counter = Counter()
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    accelerator.register_for_checkpointing(counter)
    return accelerator, model, optimizer, scheduler, loader, counter


def _train_step(accelerator, model, optimizer, scheduler, ids) -> None:
    loss = model(ids).logsumexp(-1).mean()
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_round_trip_restores_everything(tmp_path) -> None:
    accelerator, model, optimizer, scheduler, loader, counter = _setup()
    batches = iter(loader)
    _train_step(accelerator, model, optimizer, scheduler, next(batches)[0])
    counter.value = 7
    accelerator.save_state(tmp_path / "ckpt")
    expected_next = [next(batches)[0].tolist() for _ in range(2)]
    after = (torch.rand(3), random.random())
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == [
        "custom_checkpoint_0.pkl",  # Accelerate's names, where Accelerate's load_state reads them
        "dataloaders.json",
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.bin",
        "random_states_0.pkl",
        "scheduler.bin",
        "x_checkpoint.json",
    ]
    for name in ("optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl", "random_states_0.bin"):
        torch.load(tmp_path / "ckpt" / name, weights_only=True)  # never needs unrestricted pickle

    accelerator2, model2, optimizer2, scheduler2, loader2, counter2 = _setup()
    accelerator2.load_state(tmp_path / "ckpt")
    assert counter2.value == 7
    assert torch.equal(model2.embed.weight, model.embed.weight) and model2.head.weight is model2.embed.weight
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    assert optimizer2.state_dict()["state"][0]["exp_avg"].equal(optimizer.state_dict()["state"][0]["exp_avg"])
    assert (torch.rand(3).tolist(), random.random()) == (after[0].tolist(), after[1])
    resumed = accelerator2.skip_first_batches(loader2, 1)
    assert [b[0].tolist() for b in resumed][:2] == expected_next


def test_random_states_pkl_is_accelerates_format_with_the_step(tmp_path) -> None:
    """What Accelerate's load_state reads: its keys, NumPy's uint32 array, torch's state, the accelerator's step."""
    import numpy as np

    accelerator, *_ = _setup()
    accelerator.step = 3
    before = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    accelerator.save_state(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / "random_states_0.pkl", weights_only=False)
    assert sorted(saved) == ["numpy_random_seed", "random_state", "step", "torch_manual_seed"]
    assert saved["step"] == 3 and saved["random_state"] == before[0]
    assert saved["numpy_random_seed"][1].dtype == np.uint32
    assert np.array_equal(saved["numpy_random_seed"][1], before[1][1]) and saved["numpy_random_seed"][2] == before[1][2]
    assert torch.equal(saved["torch_manual_seed"], before[2])


def test_folder_with_earlier_x_names_still_loads(tmp_path) -> None:
    """x named the registered objects' files custom_checkpoint_<i>.bin before it took Accelerate's names."""
    accelerator, *_, counter = _setup()
    counter.value = 5
    accelerator.save_state(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "custom_checkpoint_0.pkl").rename(tmp_path / "ckpt" / "custom_checkpoint_0.bin")
    accelerator2, *_, counter2 = _setup()
    accelerator2.load_state(tmp_path / "ckpt")
    assert counter2.value == 5


def test_automatic_naming_keeps_total_limit_newest(tmp_path) -> None:
    accelerator, *_ = _setup(tmp_path, automatic_checkpoint_naming=True, total_limit=2)
    for _ in range(4):
        accelerator.save_state()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_2", "checkpoint_3"]
    assert accelerator.save_iteration == 4
    fresh, *_ = _setup(tmp_path, automatic_checkpoint_naming=True, total_limit=2)
    assert fresh.load_state().endswith("checkpoint_3") and fresh.save_iteration == 4


def test_crash_mid_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    accelerator, model, optimizer, scheduler, _loader, _counter = _setup()
    accelerator.save_state(tmp_path / "ckpt")
    saved = model.embed.weight.detach().clone()
    _train_step(accelerator, model, optimizer, scheduler, torch.tensor([1, 2]))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed while renaming")

    monkeypatch.setattr(checkpointing, "replace_dir", crash)
    with pytest.raises(KeyboardInterrupt):
        accelerator.save_state(tmp_path / "ckpt")
    monkeypatch.undo()
    assert (tmp_path / ".ckpt.partial").is_dir()
    other, model2, *_ = _setup()
    other.load_state(tmp_path / "ckpt")
    assert torch.equal(model2.embed.weight, saved)
    # The next save clears the leftover and completes.
    accelerator.save_state(tmp_path / "ckpt")
    assert not (tmp_path / ".ckpt.partial").exists()


def test_checkpoint_moved_aside_by_an_interrupted_replace_still_loads(tmp_path) -> None:
    accelerator, model, *_ = _setup()
    accelerator.save_state(tmp_path / "ckpt")
    (tmp_path / "ckpt").rename(tmp_path / ".ckpt.old")
    other, model2, *_ = _setup()
    assert other.load_state(tmp_path / "ckpt").endswith(".ckpt.old")
    assert torch.equal(model2.embed.weight, model.embed.weight)


def test_incomplete_or_mismatched_checkpoints_are_refused(tmp_path) -> None:
    accelerator, *_ = _setup()
    (tmp_path / "half").mkdir()
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        accelerator.load_state(tmp_path / "half")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        accelerator.load_state(tmp_path / "absent")
    accelerator.save_state(tmp_path / "ckpt")
    bare = Accelerator(cpu=True)
    bare.prepare(torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="holds 1 optimizers but 0 are prepared"):
        bare.load_state(tmp_path / "ckpt")


def test_save_state_needs_a_folder() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="output_dir"):
        accelerator.save_state()
    with pytest.raises(ValueError, match="project_dir"):
        Accelerator(cpu=True, project_config=ProjectConfiguration(automatic_checkpoint_naming=True)).save_state()


def test_save_model_shards_with_an_index_and_keeps_ties(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(Tied())
    accelerator.save_model(model, tmp_path / "m", max_shard_size=100)
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == ["embed.weight", "head.weight", "norm.bias", "norm.weight"]
    assert (
        index["weight_map"]["head.weight"] == index["weight_map"]["embed.weight"] == "model-00001-of-00002.safetensors"
    )
    assert index["metadata"]["total_size"] == (10 * 4 + 4 + 4) * 4  # the tied weight once
    loaded = load_state_dict_files(tmp_path / "m")
    assert loaded["head.weight"] is loaded["embed.weight"]
    accelerator.save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.safetensors"]
    with pytest.raises(ValueError, match="is a file"):
        accelerator.save_model(model, tmp_path / "m" / "model.safetensors")


def test_registering_an_object_without_state_dict_is_a_value_error() -> None:
    # Accelerate raises ValueError here; code written for it catches that.
    expected = (
        "every object needs state_dict and load_state_dict; Item at index 1 (int), Item at index 2 (object) lack them"
    )
    with pytest.raises(ValueError, match=rf"^register_for_checkpointing: {re.escape(expected)}$"):
        Accelerator(cpu=True).register_for_checkpointing(torch.nn.Linear(1, 1), 3, object())


@pytest.mark.parametrize("shard", ["10GB", 300])
def test_save_model_writes_pytorch_model_bin_without_safe_serialization(tmp_path, shard) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 10, bias=False)
    )
    model[2].weight = model[0].weight  # tied: stored once (320 bytes), the 8x8 weight in a shard of its own
    Accelerator(cpu=True).save_model(model, tmp_path, max_shard_size=shard, safe_serialization=False)
    if shard == "10GB":
        assert sorted(p.name for p in tmp_path.iterdir()) == ["pytorch_model.bin"]
        loaded = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    else:
        index = json.loads((tmp_path / "pytorch_model.bin.index.json").read_text())
        files = sorted(set(index["weight_map"].values()))
        assert files == sorted(p.name for p in tmp_path.glob("pytorch_model-*-of-*.bin")) and len(files) > 1
        loaded = {}
        for name in files:
            loaded.update(torch.load(tmp_path / name, weights_only=True))
    assert sorted(loaded) == ["0.weight", "1.weight", "2.weight"]
    assert torch.equal(loaded["1.weight"], model[1].weight)
    assert torch.equal(loaded["0.weight"], model[0].weight) and loaded["2.weight"] is loaded["0.weight"]  # tied


def test_save_state_without_safe_serialization_writes_pytorch_model_bin(tmp_path) -> None:
    accelerator, model, optimizer, scheduler, loader, _counter = _setup()
    _train_step(accelerator, model, optimizer, scheduler, next(iter(loader))[0])
    accelerator.save_state(tmp_path / "ckpt", safe_serialization=False)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert "pytorch_model.bin" in files and not any(name.endswith(".safetensors") for name in files)
    weights = torch.load(tmp_path / "ckpt" / "pytorch_model.bin", weights_only=True)
    assert weights["head.weight"].data_ptr() == weights["embed.weight"].data_ptr()  # tied: stored once
    assert torch.equal(weights["norm.weight"], model.norm.weight.detach())

    accelerator2, model2, *_ = _setup()
    accelerator2.load_state(tmp_path / "ckpt")
    assert torch.equal(model2.embed.weight, model.embed.weight) and model2.head.weight is model2.embed.weight
    assert torch.equal(model2.norm.bias, model.norm.bias)
