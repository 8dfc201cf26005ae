"""Where x now behaves as Accelerate does (gather with autograd, datasets splits, loader layering,
per-rank saves, debug mode...), on real processes (torchrun, gloo on CPU) and in one process.

``workers/accelerate_behaviour_worker.py`` runs the collective, data and RNG scenarios in one 2-process launch;
``workers/checkpoint_ranks_worker.py`` saves into per-rank folders and injects a failure on rank 1.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from x_runtime import Accelerator, PartialState
from x_runtime.data import SeedableRandomSampler, prepare_data_loader
from x_runtime.precision.policy import Precision
from x_runtime.process import DistributedOperationException, copy_tensor_to_devices, debug_mode, set_debug_mode


@pytest.fixture(scope="module")
def two(tmp_path_factory, launch) -> list[dict]:
    out = tmp_path_factory.mktemp("accelerate-behaviour")
    launch("accelerate_behaviour_worker.py", 2, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def ok(report: dict, name: str):
    entry = report[name]
    assert "ok" in entry, f"{name} raised {entry.get('error')}: {entry.get('message')}"
    return entry["ok"]


def test_gathering_tensors_that_require_grad(two) -> None:
    rows = [[1.0] * 3] * 2 + [[2.0] * 3] * 2
    for report in two:
        assert ok(report, "gather_grad") == rows and ok(report, "gather_leaf_grad") == rows
        assert ok(report, "gather_dict_grad") == [6.0, 12.0]
        assert ok(report, "reduce_grad") == [[1.5] * 3] * 2
        assert ok(report, "pad_grad") == [2, 3]


def test_split_between_processes_gives_a_dataset_of_the_rank_rows(two) -> None:
    assert [ok(r, "split_even") for r in two] == [["Dataset", [0, 1]], ["Dataset", [2, 3]]]
    assert [ok(r, "split_odd") for r in two] == [["Dataset", [0, 1]], ["Dataset", [2]]]
    assert [ok(r, "split_odd_padded") for r in two] == [["Dataset", [0, 1]], ["Dataset", [2, 2]]]


def test_custom_batch_sampler_sits_right_under_the_shard_and_defaults_come_from_the_group(two) -> None:
    for r, report in enumerate(two):
        outer, inner, batches = ok(report, "custom_sampler")
        assert (outer, inner) == ("BatchSamplerShard", "CustomBatchSampler")
        assert batches == [list(range(8 * r, 8 * r + 8)), list(range(16 + 8 * r, 24 + 8 * r))]
        assert ok(report, "seedable_in_shard") == "SeedableRandomSampler"
    assert [ok(r, "positional") for r in two] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_prepared_loader_follows_the_user_generator_like_the_plain_loop(two) -> None:
    plain = ok(two[0], "generator_parity")["plain"]
    mine = [ok(r, "generator_parity")["prepared"] for r in two]
    for epoch in range(2):
        joined = [mine[0][epoch][s] + mine[1][epoch][s] for s in range(4)]
        assert joined == plain[epoch]
    synced = [ok(r, "generator_synced") for r in two]  # ranks seeded differently: rank 0's state wins
    assert sorted(i for batches in synced for b in batches for i in b) == list(range(16))


def test_debug_mode_raises_the_same_exception_on_every_rank(two) -> None:
    for name in ("reduce_debug", "broadcast_debug", "broadcast_objects_debug", "pad_debug", "reduce_debug_mode"):
        errors = [r[name] for r in two]
        assert all(e.get("error") == "DistributedOperationException" for e in errors), errors
        assert errors[0]["message"] == errors[1]["message"]
    message = two[0]["reduce_debug"]["message"]
    assert "Operation: `x_runtime.process.collectives.reduce`" in message
    assert "Process 0: {'tensor': [1, 5]}" in message and "Process 1: {'tensor': [1, 2, 5]}" in message
    assert [ok(r, "reduce_debug_ok") for r in two] == [[2.0, 2.0]] * 2
    assert all(r["gather_mismatch"]["error"] == "DistributedOperationException" for r in two)


def test_copy_tensor_to_devices_and_synchronize_rng_states(two) -> None:
    assert [ok(r, "copy_tensor") for r in two] == [[1, 2, 3]] * 2
    assert ok(two[0], "sync_rng") == ok(two[1], "sync_rng")


@pytest.fixture(scope="module")
def saves(tmp_path_factory, launch) -> dict[str, list[dict]]:
    found = {}
    for mode in ("per_rank", "fail"):
        out = tmp_path_factory.mktemp(f"ckpt-{mode}")
        launch("checkpoint_ranks_worker.py", 2, str(out), mode, timeout=120)
        found[mode] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return found


def test_each_rank_saves_into_the_folder_it_was_given(saves) -> None:
    ranks = saves["per_rank"]
    assert all(r["save"].get("ok") and r["save_again"].get("ok") for r in ranks), ranks
    assert "random_states_0.bin" in ranks[0]["files"] and "model.safetensors" in ranks[0]["files"]
    assert "random_states_1.bin" in ranks[1]["files"] and "x_checkpoint.json" in ranks[1]["files"]
    # Replicas: every rank's folder holds the whole model and optimizer, and resumes by itself.
    assert {"model.safetensors", "optimizer.bin"} <= set(ranks[1]["files"])
    assert all(r["load"].get("ok") and r["restored"] for r in ranks), ranks


def test_a_failure_on_one_rank_raises_on_every_rank_within_seconds(saves) -> None:
    for rank, report in enumerate(saves["fail"]):
        # Rank 1 failed: its RuntimeError carries its traceback; rank 0 did its part and gets the
        # one-line FailedElsewhereError (a RuntimeError too): one traceback per failure.
        expected = "RuntimeError" if rank == 1 else "FailedElsewhereError"
        assert report["save"]["error"] == expected and report["save"]["seconds"] < 10, report
        assert "save_state failed on rank 1" in report["save"]["message"]
        assert "injected: disk full" in report["save"]["message"]
        assert report["save_ok"].get("ok")
        # A missing folder is the user's input: every rank raises the agreed one-line error (a RuntimeError).
        assert report["load"]["error"] == "JobError" and "load_state failed on rank 1" in report["load"]["message"]
        assert "CheckpointNotFoundError: no checkpoint at" in report["load"]["message"]
        assert report["after"].get("ok")


# --- one process -------------------------------------------------------------------------------


def test_debug_mode_switches_and_copy_on_one_process(monkeypatch) -> None:
    monkeypatch.delenv("X_DEBUG_MODE", raising=False)
    Accelerator(cpu=True)
    assert debug_mode() is False
    monkeypatch.setenv("X_DEBUG_MODE", "1")
    assert debug_mode() is False  # the settings are read once, when the state is built
    Accelerator(cpu=True)
    assert debug_mode() is True and debug_mode(False) is False
    set_debug_mode(False)  # no process group: nothing to switch, the settings decide
    assert debug_mode() is True
    monkeypatch.delenv("X_DEBUG_MODE")
    Accelerator(cpu=True)
    assert debug_mode() is False
    assert issubclass(DistributedOperationException, ValueError)
    assert copy_tensor_to_devices(torch.tensor([4])).tolist() == [4]
    with pytest.raises(DistributedOperationException):
        copy_tensor_to_devices(None)


def test_seedable_sampler_takes_accelerate_arguments() -> None:
    g = torch.Generator()
    a = SeedableRandomSampler(generator=g, data_source=range(8), num_samples=8, data_seed=5)
    b = SeedableRandomSampler(range(8), data_seed=5)
    assert a.initial_seed == 5 and list(a) == list(b)
    torch.manual_seed(11)
    assert SeedableRandomSampler(range(3)).seed == 11


def test_prepare_data_loader_takes_accelerate_positional_arguments() -> None:
    loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), "cpu", 2, 1, put_on_device=False)
    assert [b.tolist() for b in loader] == [[2, 3], [0, 1]] and loader.device is None
    g = torch.Generator()
    prepared = prepare_data_loader(DataLoader(list(range(10)), batch_size=5, shuffle=True, generator=g))
    assert type(prepared.sampler) is RandomSampler  # the user's generator drives the order
    g.manual_seed(3)
    first = [b.tolist() for b in prepared]
    g.manual_seed(3)
    assert first == [b.tolist() for b in DataLoader(list(range(10)), batch_size=5, shuffle=True, generator=g)]


def test_fp16_on_cpu_runs_as_accelerate_does() -> None:
    with pytest.warns(UserWarning, match=r"fp16' on CPU computes in float32, as Accelerate does"):
        policy = Precision("fp16", torch.device("cpu"))
    assert policy.mode == "fp16" and policy.scaler is None and not policy.enabled


@pytest.mark.filterwarnings("ignore:.*CUDA is not available")  # a GradScaler made for CUDA on a CPU-only torch
def test_deepspeed_runs_its_own_mixed_precision_as_under_accelerate() -> None:
    # Accelerate sets native_amp only outside DeepSpeed: its engine casts the model and scales
    # the loss, and a GradScaler beside it would never see a scaled loss (unscale_ would raise).
    cuda = torch.device("cuda", 0)
    native = Precision("fp16", cuda)
    assert native.scaler is not None and native.enabled
    engine_owned = Precision("fp16", cuda, native=False)
    assert engine_owned.mode == "fp16" and engine_owned.scaler is None and not engine_owned.enabled
    model = torch.nn.Linear(2, 2)
    forward = model.forward
    engine_owned.wrap_forward(model)
    assert model.forward == forward  # no autocast wrapper
    assert isinstance(engine_owned.autocast(), contextlib.nullcontext)


@pytest.mark.parametrize("variable", ["X_TORCH_DEVICE", "ACCELERATE_TORCH_DEVICE"])
def test_the_torch_device_variable_names_the_device(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    # Accelerate's test utilities set ACCELERATE_TORCH_DEVICE (e.g. "cpu:64") to pick the device outright.
    monkeypatch.setenv(variable, "cpu:64")
    assert Accelerator().device == torch.device("cpu:64")
    assert PartialState().default_device == torch.device("cpu:64")
    monkeypatch.setenv(variable, "not-a-device")
    with pytest.raises(ValueError, match=r"^X_TORCH_DEVICE or ACCELERATE_TORCH_DEVICE is 'not-a-device', not a torch"):
        PartialState()
