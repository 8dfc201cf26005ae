"""Choosing XLA, and its refusals, without torch_xla (the XLA runs are in test_xla.py)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from x_common import env
from x_runtime import Accelerator
from x_runtime.core.settings import Settings
from x_runtime.precision.policy import Precision
from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.param_moves import ParameterMoves
from x_runtime.strategies.select import decide

HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None


@pytest.mark.skipif(HAS_TORCH_XLA, reason="torch_xla is installed here: test_xla.py runs it")
def test_xla_without_torch_xla_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setenv(env.DISTRIBUTED_TYPE.name, "XLA")
    with pytest.raises(ValueError) as caught:
        Accelerator()
    message = str(caught.value)
    assert message.startswith("distributed_type XLA needs torch_xla, which is not importable (No module named")
    assert message.endswith(
        "pip install 'x-runtime[tpu]' on a TPU VM, or pip install torch_xla==<your torch version> "
        "(torch_xla is released for one torch version at a time)"
    )


@pytest.mark.parametrize("how", ["cpu=True", "x-launch --cpu"])
def test_pjrt_device_with_cpu_asked_trains_on_the_cpu_without_importing_torch_xla(monkeypatch, how: str) -> None:
    monkeypatch.setenv(env.PJRT_DEVICE.name, "TPU")
    if how == "x-launch --cpu":
        monkeypatch.setenv(env.USE_CPU.name, "1")
    accelerator = Accelerator(cpu=how == "cpu=True")
    assert (accelerator.distributed_type, accelerator.device.type) == ("NO", "cpu")
    assert HAS_TORCH_XLA or "torch_xla" not in sys.modules


def test_the_launchers_xla_contradicting_cpu_true_names_both(monkeypatch) -> None:
    monkeypatch.setenv(env.DISTRIBUTED_TYPE.name, "XLA")
    with pytest.raises(ValueError) as caught:
        Accelerator(cpu=True)
    assert (
        str(caught.value) == "X_DISTRIBUTED_TYPE=XLA asks for an XLA device but cpu=True was passed: drop one of them"
    )


def test_xla_refuses_another_process_group_backend(monkeypatch) -> None:
    from x_runtime import InitProcessGroupKwargs

    monkeypatch.setenv(env.DISTRIBUTED_TYPE.name, "XLA")
    with pytest.raises(
        ValueError, match=r"X_DISTRIBUTED_TYPE=XLA: XLA replicas talk through the 'xla' backend, not 'gloo'"
    ):
        Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])


@pytest.mark.parametrize("mode", ["fp16", "fp8"])
def test_half_precision_other_than_bf16_is_refused_on_xla(mode: str) -> None:
    with pytest.raises(ValueError) as caught:
        Precision(mode, torch.device("xla"))
    assert str(caught.value) == f"mixed_precision='{mode}' on an XLA device: TPUs compute in bf16; use 'bf16' or 'no'"


@pytest.mark.parametrize("asked", ["FSDP", "DEEPSPEED"])
def test_sharding_plugins_are_refused_on_xla(asked: str) -> None:
    state = ProcessState(0, 0, 1, 1, 0, torch.device("xla"), "xla", "XLA", "xla")
    choice = decide(settings=Settings.of({env.DISTRIBUTED_TYPE.name: asked}))
    with pytest.raises(ValueError) as caught:
        choice.build(state, mixed_precision="no")
    assert str(caught.value).startswith(f"{asked} on XLA devices: x_runtime trains XLA replicas")
    assert f"drop the {asked.lower()} plugin/config" in str(caught.value)


def test_optimizers_built_before_a_parameter_swap_follow_the_new_parameters() -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    before = list(model.parameters())
    moves = ParameterMoves()
    # What Module.to does for XLA tensors: new Parameter objects, not new data in the old ones.
    model.weight = torch.nn.Parameter(model.weight.detach().clone())
    moves.record(before, model.parameters())
    moves.repoint(optimizer)
    assert optimizer.param_groups[0]["params"][0] is model.weight
    assert optimizer.param_groups[0]["params"][1] is model.bias  # unchanged ones stay
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert torch.equal(model.weight, before[0] - 1.0)


def test_dispatching_batches_is_refused_across_xla_replicas() -> None:
    from x_runtime.data.gradient_state import GradientState
    from x_runtime.data.loader.prepare import LoaderSpec
    from x_runtime.data.sharding import Sharding
    from x_runtime.strategies.xla import XLAStrategy

    state = ProcessState(0, 0, 2, 2, 0, torch.device("xla"), "xla", "XLA", "xla")
    strategy = XLAStrategy(state, GradientState())
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    build = LoaderSpec(loader, Sharding(num_processes=2, process_index=0), dispatch_batches=True)
    with pytest.raises(ValueError) as caught:
        strategy.build_loader(build, torch.device("xla"), GradientState())
    assert str(caught.value) == (
        "dispatch_batches=True on XLA devices: every replica reads its own share of the data here; "
        "drop dispatch_batches (iterable datasets are split the same way)"
    )
    # Without a device the loader is built as usual, read by this replica (no dispatching).
    kept = strategy.build_loader(build.replace(dispatch_batches=None), None, GradientState())
    assert type(kept).__name__ == "DataLoaderShard" and [b.tolist() for b in kept] == [[0, 1], [4, 5]]


def test_an_explicit_launcher_choice_beats_an_ambient_pjrt_device(monkeypatch) -> None:
    monkeypatch.setenv(env.PJRT_DEVICE.name, "TPU")
    monkeypatch.setenv(env.DISTRIBUTED_TYPE.name, "NO")
    accelerator = Accelerator()
    assert (accelerator.distributed_type, accelerator.device.type) == ("NO", "cpu")


@pytest.mark.skipif(HAS_TORCH_XLA, reason="torch_xla is installed here")
def test_an_ambient_pjrt_device_without_torch_xla_is_not_an_error(monkeypatch) -> None:
    monkeypatch.setenv(env.PJRT_DEVICE.name, "TPU")
    assert Accelerator().distributed_type == "NO"


def test_a_prepared_optimizer_pickles_without_its_strategy_hooks() -> None:
    import pickle

    from x_runtime.data.gradient_state import GradientState
    from x_runtime.optim.optimizer import AcceleratedOptimizer
    from x_runtime.strategies.xla import XLAStrategy

    state = ProcessState(0, 0, 1, 1, 0, torch.device("xla"), "xla", "XLA", "xla")
    strategy = XLAStrategy(state, GradientState())  # holds WeakSets, which do not pickle
    model = torch.nn.Linear(2, 1)
    optimizer = AcceleratedOptimizer(
        strategy.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.5)),
        gradient_state=GradientState(),
        before_step=strategy.before_step,
        after_step=strategy.after_step,
    )
    copy = pickle.loads(pickle.dumps(optimizer))
    assert copy.param_groups[0]["lr"] == 0.5 and copy._before_step is None and copy._after_step is None
