"""Accelerate's ``accelerate.utils`` helpers x adds: nested walks, fp32 outputs, env lines, the kernel check, save."""

from __future__ import annotations

import doctest
import logging
import pickle
import platform
import warnings
from collections import OrderedDict, namedtuple
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import x_runtime
from x_runtime import (
    CannotPadNestedTensorWarning,
    check_os_kernel,
    concatenate,
    convert_dict_to_env_variables,
    convert_outputs_to_fp32,
    extract_model_from_parallel,
    listify,
    pad_across_processes,
    pad_input_tensors,
    recursively_apply,
    save,
)
from x_runtime.core import environment, nested, system
from x_runtime.io.model_files import load_tensors_file
from x_runtime.precision import policy

Pair = namedtuple("Pair", "inputs labels")


def test_doctests() -> None:
    for module in (nested, environment, policy):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_recursively_apply_passes_arguments_and_keeps_containers() -> None:
    data = {"p": Pair(torch.tensor([1]), [torch.tensor([2]), "label"]), "n": 3}
    out = recursively_apply(torch.add, data, 10, alpha=2)
    assert isinstance(out["p"], Pair) and out["p"].inputs.tolist() == [21]
    assert out["p"].labels[0].tolist() == [22] and out["p"].labels[1] == "label" and out["n"] == 3
    # test_type picks the leaves: here ints, tensors left alone
    ints = recursively_apply(lambda v: v + 1, [1, (2, torch.ones(1))], test_type=lambda v: isinstance(v, int))
    assert ints[0] == 2 and ints[1][0] == 3 and torch.equal(ints[1][1], torch.ones(1))


def test_recursively_apply_rejects_other_types_naming_function_and_test() -> None:
    with pytest.raises(TypeError) as excinfo:
        recursively_apply(torch.neg, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(excinfo.value) == (
        "Unsupported types (<class 'int'>) passed to `neg`. Only nested list/tuple/dicts of objects that are "
        "valid for `is_torch_tensor` should be passed."
    )


def test_listify_gives_nested_python_numbers() -> None:
    assert listify(torch.arange(6).reshape(2, 3)) == [[0, 1, 2], [3, 4, 5]]
    out = listify({"loss": torch.tensor([0.5], dtype=torch.bfloat16), "n": "x"})
    assert out == {"loss": [0.5], "n": "x"}


def test_concatenate_joins_structures_and_refuses_other_leaves() -> None:
    a, b = torch.randn(2, 3), torch.randn(1, 3)
    joined = concatenate([{"x": (a, a[:, :1])}, {"x": (b, b[:, :1])}])
    assert torch.equal(joined["x"][0], torch.cat([a, b])) and joined["x"][1].shape == (3, 1)
    assert torch.equal(concatenate([a, a], dim=1), torch.cat([a, a], dim=1))
    assert concatenate(["only"]) == "only"
    with pytest.raises(TypeError, match="can only join tensors, got str"):
        concatenate([{"s": "a"}, {"s": "b"}])


@pytest.mark.parametrize(
    ("batch", "processes", "rows"),
    [(1, 2, 2), (3, 2, 4), (4, 3, 6), (3, 4, 4), (4, 6, 6), (61, 6, 66), (7, 2, 8), (6, 2, 6), (6, 3, 6)],
)
def test_pad_input_tensors_pads_with_zeros_to_a_multiple(batch: int, processes: int, rows: int) -> None:
    data = torch.arange(batch * 2, dtype=torch.float32).reshape(batch, 2) + 1
    out = pad_input_tensors({"x": data}, batch, processes)["x"]
    assert out.shape == (rows, 2)
    assert torch.equal(out[:batch], data) and not out[batch:].any()


def test_convert_outputs_to_fp32_upcasts_and_unwraps_for_pickling() -> None:
    model = torch.nn.Linear(2, 2)
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(lambda x: {"y": x.half(), "n": 1})
    out = model(torch.ones(1, 2))
    assert out["y"].dtype == torch.float32 and out["n"] == 1
    with pytest.raises(pickle.PicklingError, match="keep_fp32_wrapper=False"):
        pickle.dumps(model.forward)
    plain = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in plain.__dict__ and "_original_forward" not in plain.__dict__
    assert isinstance(pickle.loads(pickle.dumps(plain)), torch.nn.Linear)


def test_convert_dict_to_env_variables_skips_unsafe_pairs(caplog: pytest.LogCaptureFixture) -> None:
    env = {"X_DEBUG_MODE": "1", "BAD": "<mything", "SPACE": "a b", "EMPTY": "", "OK": "2"}
    with caplog.at_level(logging.WARNING, logger="x_runtime.core.environment"):
        assert convert_dict_to_env_variables(env) == ["X_DEBUG_MODE=1\n", "OK=2\n"]
    assert [r.getMessage().split("=")[0] for r in caplog.records] == [
        "skipping BAD",
        "skipping SPACE",
        "skipping EMPTY",
    ]


@pytest.mark.parametrize(
    ("system_name", "release", "warns"),
    [("Linux", "5.4.0-35-generic", True), ("Linux", "5.15.0-35-generic", False), ("Darwin", "5.4.0", False)],
)
def test_check_os_kernel(caplog: pytest.LogCaptureFixture, system_name: str, release: str, warns: bool) -> None:
    info = mock.Mock(system=system_name, release=release)
    with mock.patch.object(platform, "uname", return_value=info), caplog.at_level(logging.WARNING):
        check_os_kernel()
    records = [r for r in caplog.records if r.name == system.__name__]
    assert len(records) == int(warns)
    if warns:
        assert "5.4.0" in records[0].msg and system.MIN_KERNEL_VERSION in records[0].msg


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = self.a


def test_save_safetensors_stores_shared_tensors_once_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = _Tied().state_dict()
    path = tmp_path / "model.safetensors"
    with caplog.at_level(logging.WARNING, logger="x_runtime.process.operations.saving"):
        save(state, path, safe_serialization=True)
    assert len(caplog.records) == 1 and "Removed shared tensor" in caplog.records[0].getMessage()
    assert sorted(load_file(str(path))) == ["a.bias", "a.weight"]  # a plain reader sees the kept names
    with safe_open(str(path), framework="pt") as handle:
        assert "b.weight" in (handle.metadata() or {})["aliases"]
    loaded = load_tensors_file(path)
    assert torch.equal(loaded["b.weight"], state["a.weight"])


def test_save_pickles_on_the_main_process_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save(OrderedDict(step=3), tmp_path / "state.bin")
    assert torch.load(tmp_path / "state.bin") == {"step": 3}
    monkeypatch.setattr("x_runtime.process.operations.saving.rank", lambda: 1)
    save({"step": 4}, tmp_path / "other.bin")
    assert not (tmp_path / "other.bin").exists()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    save({"step": 5}, tmp_path / "node.bin", save_on_each_node=True)  # rank 1, but its node's first
    assert torch.load(tmp_path / "node.bin") == {"step": 5}


def test_pad_across_processes_leaves_nested_tensors_with_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own prototype warning for nested tensors
        nt = torch.nested.nested_tensor([[1, 2, 3], [1]])
    with pytest.warns(CannotPadNestedTensorWarning):
        out = pad_across_processes({"n": nt, "t": torch.ones(2)})
    assert out["n"] is nt and torch.equal(out["t"], torch.ones(2))
    assert issubclass(x_runtime.CannotPadNestedTensorWarning, UserWarning)
