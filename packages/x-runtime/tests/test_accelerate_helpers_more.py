"""Accelerate names that transformers, TRL and PEFT call, side by side with the real Accelerate 1.15.

Module lookup by name, ``is_peft_model``, the ``is_*_available`` checks, the named constants,
``tqdm``, the test helpers PEFT's suite imports, the DeepSpeed config and stand-in classes,
``DeepSpeedPlugin`` and ``GradientState``: each compared by value with Accelerate's own on the
same input, where Accelerate has one.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import warnings
from pathlib import Path

import accelerate.test_utils.testing as accelerate_testing
import accelerate.utils
import accelerate.utils.constants
import accelerate.utils.imports as accelerate_imports
import pytest
import torch
from accelerate.utils import DeepSpeedPlugin as AccelerateDeepSpeedPlugin
from accelerate.utils import GradientAccumulationPlugin as AccelerateGradientAccumulationPlugin
from accelerate.utils.dataclasses import get_module_class_from_name as accelerate_get_module_class_from_name
from accelerate.utils.deepspeed import DummyOptim as AccelerateDummyOptim
from accelerate.utils.deepspeed import DummyScheduler as AccelerateDummyScheduler
from accelerate.utils.deepspeed import HfDeepSpeedConfig as AccelerateHfDeepSpeedConfig
from accelerate.utils.fsdp_utils import get_parameters_from_modules as accelerate_get_parameters_from_modules

import x_runtime
from x_runtime import (
    Accelerator,
    DeepSpeedPlugin,
    DummyOptim,
    DummyScheduler,
    GradientAccumulationPlugin,
    GradientState,
    HfDeepSpeedConfig,
    get_module_class_from_name,
    get_parameters_from_modules,
    is_peft_model,
)
from x_runtime.core import constants, imports, testing


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.norm = torch.nn.LayerNorm(3)
        self.act = torch.nn.GELU()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())


# --- module lookup ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Net", "Block", "Linear", "LayerNorm", "GELU", "ReLU", "Sequential", "Conv2d", ""])
def test_get_module_class_from_name_as_accelerate(name: str) -> None:
    model = Net()
    assert get_module_class_from_name(model, name) is accelerate_get_module_class_from_name(model, name)
    assert get_module_class_from_name(torch.nn.ReLU(), name) is accelerate_get_module_class_from_name(
        torch.nn.ReLU(), name
    )


def _named(parameters: set[torch.nn.Parameter], model: torch.nn.Module) -> tuple[set[str], set[str]]:
    """The names of ``parameters`` in ``model``, and the names of the model's parameters on meta."""
    names = {id(p): n for n, p in model.named_parameters()}
    on_meta = {n for n, p in model.named_parameters() if p.device.type == "meta"}
    return {names.get(id(p), "<not in model>") for p in parameters}, on_meta


@pytest.mark.parametrize(
    "pattern", [r"blocks\.\d+\.fc", r"blocks\.1", "head", r"blocks\.\d+", "embed|head\\.0", "fc", ""]
)
def test_get_parameters_from_modules_by_regex_as_accelerate(pattern: str) -> None:
    # "meta" makes the move visible: modules named by the expression go to ``device``, whole-name matches only.
    ours_model, theirs_model = Net(), Net()
    ours = _named(get_parameters_from_modules(pattern, ours_model, "meta"), ours_model)
    theirs = _named(accelerate_get_parameters_from_modules(pattern, theirs_model, "meta"), theirs_model)
    assert ours == theirs


def test_get_parameters_from_modules_list_and_none_as_accelerate() -> None:
    model = Net()
    modules = [model.blocks[0].norm, model.head, model.blocks[0]]  # overlapping: each parameter once
    assert get_parameters_from_modules(modules, model, "cpu") == accelerate_get_parameters_from_modules(
        modules, model, "cpu"
    )
    assert len(get_parameters_from_modules(modules, model, "cpu")) == 6
    assert get_parameters_from_modules(iter(modules), model, "cpu") == set(
        accelerate_get_parameters_from_modules(modules, model, "cpu")
    )
    assert get_parameters_from_modules(None, model, "cpu") == accelerate_get_parameters_from_modules(None, model, "cpu")
    assert get_parameters_from_modules([], model, "cpu") == set()
    assert all(p.device.type == "cpu" for p in model.parameters())  # a list is not moved


# --- is_peft_model ---------------------------------------------------------------------------


def test_is_peft_model_false_for_plain_modules() -> None:
    assert is_peft_model(Net()) is False
    assert is_peft_model(torch.nn.Linear(2, 2)) is False
    assert is_peft_model(object()) is False


def test_is_peft_model_true_for_a_peft_model() -> None:
    peft = pytest.importorskip("peft")
    from accelerate.utils import is_peft_model as accelerate_is_peft_model

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.out = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.proj(x))

    base = Tiny()
    model = peft.get_peft_model(base, peft.LoraConfig(target_modules=["proj"], r=2))
    assert is_peft_model(model) is True and accelerate_is_peft_model(model) is True
    assert is_peft_model(Tiny()) is False and accelerate_is_peft_model(Tiny()) is False


# --- is_*_available ----------------------------------------------------------------------------

# (function name, module that is imported, distribution whose metadata says it is installed, version)
PACKAGE_CHECKS = [
    ("is_peft_available", "peft", "peft", "0.21.0"),
    ("is_timm_available", "timm", "timm", "1.0.0"),
    ("is_torchvision_available", "torchvision", "torchvision", "0.22.0"),
    ("is_pandas_available", "pandas", "pandas", "2.2.0"),
    ("is_matplotlib_available", "matplotlib", "matplotlib", "3.9.0"),
    ("is_boto3_available", "boto3", "boto3", "1.35.0"),
    ("is_rich_available", "rich", "rich", "13.0.0"),
    ("is_tqdm_available", "tqdm", "tqdm", "4.66.0"),
    ("is_torchao_available", "torchao", "torchao", "0.7.0"),
    ("is_transformer_engine_available", "transformer_engine", "transformer-engine", "1.11.0"),
    ("is_msamp_available", "msamp", "ms-amp", "0.4.0"),
]
FP8_BACKENDS = ("torchao", "transformer_engine", "msamp")
AVAILABILITY = [name for name, *_ in PACKAGE_CHECKS] + ["is_fp8_available"]


def _accelerate_check(name: str):
    return getattr(accelerate_imports, name)  # is_tqdm_available is not re-exported by accelerate.utils


@pytest.mark.parametrize("name", AVAILABILITY)
def test_is_available_as_accelerate_here(name: str, monkeypatch) -> None:
    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    ours = getattr(x_runtime, name)()
    assert getattr(imports, name) is getattr(x_runtime, name)
    assert type(ours) is bool  # Accelerate answers None for a missing package; bool() of it is the same answer
    assert ours == bool(_accelerate_check(name)())


def _install_fake(site: Path, module: str, distribution: str | None, version: str) -> None:
    """What pip leaves on disk: the import package and (unless None) its ``.dist-info``."""
    (site / module).mkdir()
    (site / module / "__init__.py").write_text("")
    if distribution is not None:
        info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")


@pytest.mark.parametrize("name, module, distribution, version", PACKAGE_CHECKS, ids=[c[0] for c in PACKAGE_CHECKS])
def test_is_available_as_accelerate_when_installed(name, module, distribution, version, tmp_path, monkeypatch) -> None:
    # A package installed in front of sys.path (its import folder and its dist-info, as pip writes them).
    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    _install_fake(tmp_path, module, distribution, version)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert getattr(x_runtime, name)() == bool(_accelerate_check(name)())
    if module in FP8_BACKENDS:
        assert x_runtime.is_fp8_available() == accelerate.utils.is_fp8_available()


@pytest.mark.parametrize("module", ["timm", "torchao", "msamp", "transformer_engine"])
def test_a_stray_folder_is_not_an_installed_package(module: str, tmp_path, monkeypatch) -> None:
    _install_fake(tmp_path, module, None, "")
    monkeypatch.syspath_prepend(str(tmp_path))
    name = next(n for n, m, *_ in PACKAGE_CHECKS if m == module)
    assert getattr(x_runtime, name)() is False and not _accelerate_check(name)()


def test_an_old_torchao_is_not_an_fp8_backend(tmp_path, monkeypatch) -> None:
    _install_fake(tmp_path, "torchao", "torchao", "0.5.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert x_runtime.is_torchao_available() is False and accelerate.utils.is_torchao_available() is False


@pytest.mark.parametrize("flag", [None, "1", "0"])
def test_is_rich_available_follows_accelerate_enable_rich(flag: str | None, tmp_path, monkeypatch) -> None:
    # Accelerate answers True only when rich is installed AND ACCELERATE_ENABLE_RICH is set true.
    _install_fake(tmp_path, "rich", "rich", "13.0.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    if flag is None:
        monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_ENABLE_RICH", flag)
    expected = bool(accelerate.utils.is_rich_available())
    assert expected is (flag == "1")
    assert x_runtime.is_rich_available() is expected


# --- constants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", constants.__all__)
def test_constant_as_accelerate(name: str) -> None:
    ours = getattr(constants, name)
    assert ours == getattr(accelerate.utils.constants, name)
    assert getattr(x_runtime, name) is ours


# --- tqdm --------------------------------------------------------------------------------------


def _disabled(**kwargs) -> bool:
    bar = x_runtime.tqdm(range(3), file=io.StringIO(), **kwargs)
    try:
        return bool(bar.disable)
    finally:
        bar.close()


def test_tqdm_shows_on_the_local_main_process_only(monkeypatch) -> None:
    assert sum(x_runtime.tqdm(range(4), file=io.StringIO())) == 6
    assert _disabled() is False and _disabled(main_process_only=False) is False
    monkeypatch.setenv("LOCAL_RANK", "1")  # a LOCAL_RANK with no world around it is still one process
    assert _disabled() is False
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _disabled() is True
    assert _disabled(main_process_only=False) is False
    assert _disabled(main_process_only=False, disable=True) is True
    monkeypatch.setenv("RANK", "3")  # the second node's local main process shows its bar
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _disabled() is False


def test_tqdm_refuses_a_bool_first_argument_as_accelerate() -> None:
    # Accelerate's old signature was tqdm(main_process_only, *args); it now refuses a bool there.
    with pytest.raises(ValueError, match="main_process_only") as theirs:
        accelerate.utils.tqdm(True, range(3))
    with pytest.raises(ValueError) as ours:
        x_runtime.tqdm(True, range(3), file=io.StringIO())
    assert "main_process_only" in str(ours.value), str(theirs.value)


def test_tqdm_disabled_on_rank_one_as_accelerate_in_two_real_processes(inline_worker, workers) -> None:
    script = inline_worker(
        """
        import io, os
        import torch.distributed as dist
        from _helpers import report
        import x_runtime
        from accelerate import PartialState
        from accelerate.utils import tqdm as accelerate_tqdm

        # As a script that built Accelerator(cpu=True) first: on a machine without GPUs, Accelerate's
        # state is distributed only when told cpu=True (a bare PartialState() there is one process).
        PartialState(cpu=True)

        def disabled(make, **kwargs):
            bar = make(range(3), file=io.StringIO(), **kwargs)
            disable = bool(bar.disable)  # read before close(), which sets it
            bar.close()
            return disable

        report({
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "x": [disabled(x_runtime.tqdm), disabled(x_runtime.tqdm, main_process_only=False)],
            "accelerate": [disabled(accelerate_tqdm), disabled(accelerate_tqdm, main_process_only=False)],
        })
        if dist.is_initialized():
            dist.destroy_process_group()
        """
    )
    assert workers(script, 2) == [
        {"local_rank": 0, "x": [False, False], "accelerate": [False, False]},
        {"local_rank": 1, "x": [True, False], "accelerate": [True, False]},
    ]


# --- test helpers ------------------------------------------------------------------------------


def test_get_backend_as_accelerate() -> None:
    ours, theirs = testing.get_backend(), accelerate_testing.get_backend()
    assert len(ours) == len(theirs) == 3
    assert ours[:2] == theirs[:2]
    assert callable(ours[2])
    if ours[0] == "cpu":
        assert ours[2]() == theirs[2]() == 0


def test_run_command_returns_stdout_as_accelerate() -> None:
    command = [Path(sys.executable), "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
    ours = testing.run_command(list(command), return_stdout=True)
    assert ours == accelerate_testing.run_command(list(command), return_stdout=True)
    assert ours.splitlines() == ["out", "err"]  # stderr folded in
    assert testing.run_command(list(command)) is None and accelerate_testing.run_command(list(command)) is None
    env = {"X_TEST_VALUE": "seen", "PATH": ""}
    read = [sys.executable, "-c", "import os; print(os.environ['X_TEST_VALUE'])"]
    assert testing.run_command(read, return_stdout=True, env=env) == "seen\n"


def test_run_command_failure_names_the_command_and_its_output() -> None:
    command = [sys.executable, "-c", "import sys; print('it broke'); sys.exit(3)"]
    with pytest.raises(testing.SubprocessCallException) as ours:
        testing.run_command(list(command))
    with pytest.raises(accelerate_testing.SubprocessCallException) as theirs:
        accelerate_testing.run_command(list(command))
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value).startswith(f"Command `{' '.join(command)}` failed with the following error:\n\n")
    assert "it broke" in str(ours.value)
    assert isinstance(ours.value.__cause__, subprocess.CalledProcessError)


# --- HfDeepSpeedConfig -------------------------------------------------------------------------

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "fp16": {"enabled": False},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.0}},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "none"}},
}


def _sources(config: dict, tmp_path: Path) -> dict[str, object]:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    text = json.dumps(config)
    return {
        "dict": config,
        "file": str(path),
        "path": path,
        "json": text,
        "base64": base64.urlsafe_b64encode(text.encode()).decode(),
    }


QUERIES = [
    "zero_optimization.stage",
    "zero_optimization.offload_param.device",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.missing",
    "missing.section.key",
    "optimizer.params.lr",
    "optimizer.params.weight_decay",
    "train_micro_batch_size_per_gpu",
    "bf16.enabled",
    "fp16.enabled",
    "fp16.missing",
]


def _answers(config) -> dict[str, object]:
    return {
        "stage": (config.is_zero2(), config.is_zero3(), config.is_offload()),
        "values": [config.get_value(q) for q in QUERIES],
        "defaults": [config.get_value(q, "dflt") for q in QUERIES],
        "true": [config.is_true(q) for q in QUERIES],
        "false": [config.is_false(q) for q in QUERIES],
        "nodes": [config.find_config_node(q) for q in QUERIES],
        "config": config.config,
    }


@pytest.mark.parametrize("kind", ["dict", "file", "path", "json", "base64"])
def test_hf_deepspeed_config_reads_as_accelerate(kind: str, tmp_path) -> None:
    source = _sources(DS_CONFIG, tmp_path)[kind]
    ours, theirs = HfDeepSpeedConfig(source), AccelerateHfDeepSpeedConfig(source)
    assert _answers(ours) == _answers(theirs)
    assert ours.config == DS_CONFIG
    assert (ours.is_zero3(), ours.is_offload(), ours.get_value("optimizer.params.lr", 1)) == (True, True, "auto")
    assert ours.is_false("optimizer.params.weight_decay") and not ours.is_true("optimizer.params.weight_decay")


@pytest.mark.parametrize(
    "encode", [json.dumps, lambda text: base64.urlsafe_b64encode(json.dumps(text).encode()).decode()]
)
def test_hf_deepspeed_config_reads_short_json_text_as_accelerate(encode) -> None:
    # Shorter than a file name may be: the text form works; longer configs are the cases above.
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    ours, theirs = HfDeepSpeedConfig(encode(config)), AccelerateHfDeepSpeedConfig(encode(config))
    assert _answers(ours) == _answers(theirs) and ours.config == config


@pytest.mark.parametrize(
    "zero",
    [
        {"stage": 2},
        {"stage": 2, "offload_optimizer": {"device": "nvme"}},
        {"stage": 1, "offload_optimizer": {"device": "cpu"}},  # stage 1 never counts as offloaded
        {"stage": 3, "offload_param": {"device": "none"}},
        {},
    ],
)
def test_hf_deepspeed_config_stages_as_accelerate(zero: dict) -> None:
    config = {"zero_optimization": zero}
    ours, theirs = HfDeepSpeedConfig(config), AccelerateHfDeepSpeedConfig(config)
    assert (ours.is_zero2(), ours.is_zero3(), ours.is_offload()) == (
        theirs.is_zero2(),
        theirs.is_zero3(),
        theirs.is_offload(),
    )


def test_hf_deepspeed_config_copies_the_dict_it_is_given() -> None:
    given = json.loads(json.dumps(DS_CONFIG))
    ours = HfDeepSpeedConfig(given)
    assert ours.config == given and ours.config is not given
    ours.config["optimizer"]["params"]["lr"] = 0.5  # Trainer fills "auto" in place: the caller's dict keeps it
    assert given["optimizer"]["params"]["lr"] == "auto"
    assert AccelerateHfDeepSpeedConfig(given).config is not given


@pytest.mark.parametrize(
    "key, must_exist",
    [
        ("optimizer.params", False),
        ("optimizer", True),
        ("zero_optimization.offload_param", True),
        ("missing", False),
        ("optimizer.missing", False),
        ("missing.deeper.key", False),
    ],
)
def test_del_config_sub_tree_as_accelerate(key: str, must_exist: bool) -> None:
    ours, theirs = HfDeepSpeedConfig(DS_CONFIG), AccelerateHfDeepSpeedConfig(DS_CONFIG)
    ours.del_config_sub_tree(key, must_exist=must_exist)
    theirs.del_config_sub_tree(key, must_exist=must_exist)
    assert ours.config == theirs.config
    assert ours.get_value(key) is None


@pytest.mark.parametrize("key", ["missing", "optimizer.missing", "missing.deeper.key"])
def test_del_config_sub_tree_must_exist_raises_as_accelerate(key: str) -> None:
    ours, theirs = HfDeepSpeedConfig(DS_CONFIG), AccelerateHfDeepSpeedConfig(DS_CONFIG)
    with pytest.raises(ValueError) as ours_error:
        ours.del_config_sub_tree(key, must_exist=True)
    with pytest.raises(ValueError) as theirs_error:
        theirs.del_config_sub_tree(key, must_exist=True)
    assert str(ours_error.value) == str(theirs_error.value)
    assert ours.config == theirs.config == DS_CONFIG


@pytest.mark.parametrize("bad", ["/nonexistent/dir/ds_config.json", "{not json", "not a config at all"])
def test_hf_deepspeed_config_bad_input_is_one_line(bad: str) -> None:
    with pytest.raises(ValueError):
        AccelerateHfDeepSpeedConfig(bad)
    with pytest.raises(ValueError) as excinfo:
        HfDeepSpeedConfig(bad)
    message = str(excinfo.value)
    assert "\n" not in message and "DeepSpeed config" in message and repr(bad[:80]) in message


def test_hf_deepspeed_config_bad_json_file_names_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{\n  "zero_optimization": {"stage": 3,}\n}\n')
    with pytest.raises(ValueError) as excinfo:
        HfDeepSpeedConfig(str(path))
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"DeepSpeed config {path}, line 2: not valid JSON")


# --- DummyOptim / DummyScheduler -----------------------------------------------------------------


def test_dummy_optim_and_scheduler_hold_what_accelerate_holds() -> None:
    params = list(torch.nn.Linear(2, 2).parameters())
    for args, kwargs in (((params,), {}), ((params, 0.1, 0.01), {"betas": (0.8, 0.9)}), ((), {"params": params})):
        assert vars(DummyOptim(*args, **kwargs)) == vars(AccelerateDummyOptim(*args, **kwargs))
    assert vars(DummyOptim(params)) == {"params": params, "lr": 0.001, "weight_decay": 0, "kwargs": {}}

    optim = DummyOptim(params)

    def make(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    for args, kwargs in (
        ((optim,), {}),
        ((optim, 100, 10), {"warmup_type": "linear"}),
        ((optim,), {"lr_scheduler_callable": make, "total_num_steps": 5}),
    ):
        assert vars(DummyScheduler(*args, **kwargs)) == vars(AccelerateDummyScheduler(*args, **kwargs))
    assert vars(DummyScheduler(optim)) == {
        "optimizer": optim,
        "total_num_steps": None,
        "warmup_num_steps": 0,
        "lr_scheduler_callable": None,
        "kwargs": {},
    }


# --- DeepSpeedPlugin ---------------------------------------------------------------------------


def _plugin_config(stage: int = 2, **extra) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": "auto"},
        **extra,
    }


def test_deepspeed_plugin_keeps_the_hf_deepspeed_config_dict_itself() -> None:
    held = HfDeepSpeedConfig(_plugin_config(3))
    plugin = DeepSpeedPlugin(hf_ds_config=held)
    assert plugin.hf_ds_config is held
    assert plugin.config is held.config and plugin.deepspeed_config is held.config
    held.config["optimizer"]["params"]["lr"] = 0.25  # Trainer fills "auto" after the Accelerator exists
    assert plugin.config["optimizer"]["params"]["lr"] == 0.25 and plugin.get_value("optimizer.params.lr") == 0.25
    replacement = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2})
    plugin.hf_ds_config = replacement
    assert plugin.config is replacement.config and plugin.deepspeed_config is replacement.config
    # Accelerate keeps the same dict too
    theirs_held = AccelerateHfDeepSpeedConfig(_plugin_config(3))
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=theirs_held)
    assert theirs.hf_ds_config is theirs_held and theirs.deepspeed_config is theirs_held.config


def test_deepspeed_plugin_from_a_dict_does_not_change_the_callers_dict() -> None:
    given = _plugin_config(3)
    plugin = DeepSpeedPlugin(hf_ds_config=given)
    plugin.deepspeed_config_process(must_match=False, **{"optimizer.params.lr": 0.1})
    assert given == _plugin_config(3) and plugin.config is not given


@pytest.mark.parametrize(
    "kwargs",
    [
        {"optimizer.params.lr": 0.1},
        {"optimizer.params.lr": 0.1, "optimizer.params.weight_decay": 0.5},  # not "auto": left as written
        {"optimizer.params.lr": 3e-4, "optimizer.params.missing": 1, "missing.section": 2},
    ],
)
def test_deepspeed_config_process_fills_only_auto_values_as_accelerate(kwargs: dict) -> None:
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config())
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config())
    ours.deepspeed_config_process(must_match=False, **kwargs)
    theirs.deepspeed_config_process(must_match=False, **kwargs)
    assert ours.config["optimizer"] == theirs.deepspeed_config["optimizer"]
    assert ours.config["optimizer"]["params"] == {"lr": kwargs["optimizer.params.lr"], "weight_decay": 0.01}
    assert not ours.is_auto("optimizer.params.lr") and not ours.is_auto("optimizer.params.missing")
    assert "missing" not in ours.config and "missing" not in ours.config["optimizer"]["params"]


def test_deepspeed_config_process_must_match_lists_the_mismatch_as_accelerate() -> None:
    kwargs = {"optimizer.params.lr": 0.1, "optimizer.params.weight_decay": 0.5}
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config())
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config())
    with pytest.raises(ValueError) as ours_error:
        ours.deepspeed_config_process(must_match=True, **kwargs)
    with pytest.raises(ValueError) as theirs_error:
        theirs.deepspeed_config_process(must_match=True, **kwargs)
    line = "- ds optimizer.params.weight_decay=0.01 vs arg optimizer.params.weight_decay=0.5"
    assert line in str(ours_error.value).splitlines() and line in str(theirs_error.value).splitlines()
    assert "lr" not in str(ours_error.value)


def test_fill_match_auto_without_a_value_raises_as_accelerate() -> None:
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config())
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config())
    with pytest.raises(ValueError, match=r"optimizer\.params\.lr"):
        theirs.fill_match("optimizer.params.lr", must_match=False)
    with pytest.raises(ValueError, match=r"optimizer\.params\.lr"):
        ours.fill_match("optimizer.params.lr", must_match=False)
    mismatches: list[str] = []
    ours.fill_match("optimizer.params.weight_decay", mismatches, **{"optimizer.params.weight_decay": 0.2})
    theirs_mismatches: list[str] = []
    theirs.fill_match("optimizer.params.weight_decay", theirs_mismatches, **{"optimizer.params.weight_decay": 0.2})
    assert (
        mismatches
        == theirs_mismatches
        == ["- ds optimizer.params.weight_decay=0.01 vs arg optimizer.params.weight_decay=0.2"]
    )
    ours.fill_match("optimizer.params.lr", **{"optimizer.params.lr": 0.3})
    assert ours.get_value("optimizer.params.lr") == 0.3


@pytest.mark.parametrize(
    "extra",
    [{}, {"fp16": {"enabled": "auto"}}, {"fp16": {"enabled": False}, "bf16": {"enabled": "auto"}}],
    ids=["no-sections", "fp16-auto", "bf16-auto"],
)
def test_set_mixed_precision_bf16_as_accelerate(extra: dict) -> None:
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config(**extra))
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config(**extra))
    ours.set_mixed_precision("bf16")
    theirs.set_mixed_precision("bf16")
    assert ours.config["bf16"] == theirs.deepspeed_config["bf16"] == {"enabled": True}
    # Accelerate also writes {"enabled": False} for a missing fp16 section; a missing section is off all the same.
    assert ours.config.get("fp16", {"enabled": False}) == theirs.deepspeed_config["fp16"]


def test_set_mixed_precision_refuses_the_other_half_enabled_as_accelerate() -> None:
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config(fp16={"enabled": True}))
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config(fp16={"enabled": True}))
    with pytest.raises(ValueError):
        theirs.set_mixed_precision("bf16")
    with pytest.raises(ValueError, match="fp16"):
        ours.set_mixed_precision("bf16")


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("flag", [None, True, False])
def test_zero3_init_flag_as_accelerate(stage: int, flag: bool | None) -> None:
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config(stage), zero3_init_flag=flag)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Accelerate warns when the flag is asked for below stage 3
        theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config(stage), zero3_init_flag=flag)
    expected = stage == 3 and flag is not False  # on by default under ZeRO-3, never elsewhere
    assert theirs.zero3_init_flag is expected
    assert ours.zero3_init_flag is expected
    assert ours.is_zero3_init_enabled() is expected


@pytest.mark.parametrize("value", ["true", "false"])
def test_zero3_init_flag_from_accelerates_variable_as_accelerate(value: str, monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", value)
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config(3))
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config(3))
    assert ours.zero3_init_flag is theirs.zero3_init_flag is (value == "true")


@pytest.mark.parametrize("save_16bit", [None, True, False])
def test_gather_16bit_weights_auto_is_filled_from_zero3_save_16bit_model(save_16bit: bool | None) -> None:
    ours = DeepSpeedPlugin(hf_ds_config=_plugin_config(3), zero3_save_16bit_model=save_16bit)
    theirs = AccelerateDeepSpeedPlugin(hf_ds_config=_plugin_config(3), zero3_save_16bit_model=save_16bit)
    key = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
    assert ours.get_value(key) == theirs.get_value(key) == bool(save_16bit)
    assert ours.zero_stage == theirs.zero_stage == 3


# --- GradientState -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"num_steps": 2, "sync_each_batch": True},
        {"num_steps": 3, "adjust_scheduler": False},
        {"num_steps": 4, "sync_with_dataloader": False},
        {"num_steps": 1},
    ],
)
def test_gradient_state_plugin_kwargs_as_accelerate(options: dict) -> None:
    expected = AccelerateGradientAccumulationPlugin(**options).to_kwargs()
    state = GradientState(GradientAccumulationPlugin(**options))
    assert state.plugin_kwargs == expected
    assert state.num_steps == options["num_steps"]
    assert GradientState().plugin_kwargs == {}


def test_accelerator_gradient_state_follows_set_sync_gradients() -> None:
    plugin = GradientAccumulationPlugin(num_steps=2, sync_each_batch=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    state = accelerator.gradient_state
    assert isinstance(state, GradientState)
    assert state.plugin_kwargs == AccelerateGradientAccumulationPlugin(num_steps=2, sync_each_batch=True).to_kwargs()
    assert state.plugin_kwargs == {"num_steps": 2, "sync_each_batch": True}
    assert accelerator.gradient_accumulation_steps == 2
    state._set_sync_gradients(False)
    assert state.sync_gradients is False and accelerator.sync_gradients is False
    state._set_sync_gradients(True)
    assert state.sync_gradients is True and accelerator.sync_gradients is True
