"""Accelerator in one process: prepare, accumulation, precision, the launcher contract."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from x_common import env
from x_runtime import Accelerator, AutocastKwargs, DataLoaderConfiguration, GradientAccumulationPlugin
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler


def _parts(n: int = 8, batch: int = 2):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(n, 3), torch.randn(n, 1)), batch_size=batch)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, loader, scheduler


def test_prepare_returns_objects_in_the_order_given() -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader, scheduler = _parts()
    prepared = accelerator.prepare(scheduler, loader, "untouched", optimizer, model)
    assert isinstance(prepared[0], AcceleratedScheduler)
    assert len(prepared[1]) == 4 and prepared[1].total_batch_size == 2
    assert prepared[2] == "untouched"
    assert isinstance(prepared[3], AcceleratedOptimizer)
    assert prepared[4] is model  # one process: no wrapper
    assert prepared[0].optimizers == [prepared[3]]
    assert accelerator.prepare(model.weight) is model.weight


def test_a_prepared_object_prepared_again_comes_back_as_it_is() -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(*_parts(n=8, batch=2)[:3])
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer.optimizer, 1))
    again = accelerator.prepare(model, optimizer, loader, scheduler)
    assert all(a is b for a, b in zip(again, (model, optimizer, loader, scheduler), strict=True))
    assert len(accelerator._prepared.dataloaders) == 1 and len(accelerator._prepared.schedulers) == 1


def test_accumulate_steps_only_on_boundaries_and_on_the_last_batch() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model, optimizer, loader, scheduler = accelerator.prepare(*_parts(n=10, batch=2))  # 5 batches
    syncs, weights = [], []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            syncs.append(accelerator.sync_gradients)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            weights.append(model.weight.detach().clone())
    # Boundary after 3 micro-batches, and the loader's last batch forces a sync.
    assert syncs == [False, False, True, False, True]
    changed = [not torch.equal(a, b) for a, b in itertools.pairwise(weights)]
    assert changed == [False, True, False, True]
    assert scheduler.get_last_lr() == [pytest.approx(0.1 * 0.5**2)]


def test_backward_divides_the_loss_by_the_accumulation_steps() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    weight = torch.nn.Parameter(torch.ones(1))
    accelerator.backward(weight.sum() * 8)
    assert weight.grad.item() == pytest.approx(2.0)


def test_plugin_and_steps_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        Accelerator(cpu=True, gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(2))


def test_clip_grad_norm_returns_the_norm_before_clipping() -> None:
    accelerator = Accelerator(cpu=True)
    weight = torch.nn.Parameter(torch.zeros(2))
    (weight * torch.tensor([3.0, 4.0])).sum().backward()
    norm = accelerator.clip_grad_norm_([weight], max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    assert weight.grad.norm().item() == pytest.approx(1.0, rel=1e-5)
    accelerator.clip_grad_value_([weight], 0.1)
    assert weight.grad.abs().max().item() <= 0.1 + 1e-7


def test_bf16_forward_autocasts_and_returns_fp32() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    out = model(torch.randn(2, 4))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    with accelerator.autocast():
        assert torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with accelerator.autocast(AutocastKwargs(enabled=False)):
        assert torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2)).dtype == torch.float32
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.randn(2, 4)).dtype == torch.float32 and seen[-1] == torch.float32


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (
            "fp8",
            "mixed_precision='fp8' needs an NVIDIA GPU of compute capability >= 8.9 (H100, L4, RTX 4090); this run computes on cpu: use 'bf16'",
        ),
        ("fp32", "mixed_precision='fp32' is not one of no, fp16, bf16, fp8"),
    ],
)
def test_unusable_precision_is_refused_with_the_alternative(mode, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Accelerator(cpu=True, mixed_precision=mode)


def test_fp16_on_cpu_is_accepted_and_computes_in_float32_as_in_accelerate() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    assert accelerator.mixed_precision == "fp16" and accelerator.scaler is None


def test_launcher_contract_sets_precision_accumulation_and_cpu(monkeypatch) -> None:
    monkeypatch.setenv(env.MIXED_PRECISION.name, "bf16")
    monkeypatch.setenv(env.GRADIENT_ACCUMULATION_STEPS.name, "4")
    monkeypatch.setenv(env.USE_CPU.name, "1")
    accelerator = Accelerator()
    assert (accelerator.mixed_precision, accelerator.gradient_accumulation_steps) == ("bf16", 4)
    assert accelerator.device.type == "cpu"
    # Arguments in code win over the launcher.
    assert Accelerator(mixed_precision="no", gradient_accumulation_steps=2).mixed_precision == "no"


def test_fsdp_without_a_process_group_says_how_to_launch(monkeypatch) -> None:
    monkeypatch.setenv(env.DISTRIBUTED_TYPE.name, "FSDP")
    with pytest.raises(ValueError, match=r"FSDP needs a process group, .* `x-launch --num_processes N script.py`"):
        Accelerator(cpu=True)


def test_malformed_launcher_variable_names_variable_and_value(monkeypatch) -> None:
    monkeypatch.setenv(env.GRADIENT_ACCUMULATION_STEPS.name, "two")
    with pytest.raises(ValueError, match="X_GRADIENT_ACCUMULATION_STEPS"):
        Accelerator(cpu=True)


def test_two_accelerators_in_one_process_do_not_share_state() -> None:
    first = Accelerator(cpu=True, gradient_accumulation_steps=2)
    second = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
    model = first.prepare(torch.nn.Linear(1, 1))
    with first.accumulate(model):
        pass
    assert first.sync_gradients is False and second.sync_gradients is True
    assert first.even_batches is True and second.even_batches is False
    assert second.gradient_accumulation_steps == 1


def test_single_process_helpers() -> None:
    accelerator = Accelerator(cpu=True)
    assert (accelerator.is_main_process, accelerator.is_local_main_process, accelerator.is_last_process) == (
        True,
        True,
        True,
    )
    assert accelerator.distributed_type == "NO"
    with accelerator.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]
    assert accelerator.gather(torch.tensor([1, 2])).tolist() == [1, 2]
    accelerator.set_trigger()
    assert accelerator.check_trigger() is True and accelerator.check_trigger() is False
    with pytest.raises(ValueError, match="process_index"):
        accelerator.on_process(lambda: None)


def test_optimizer_state_follows_the_wrapped_optimizer() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    raw = torch.optim.Adam(model.parameters())
    model, optimizer = accelerator.prepare(model, raw)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert optimizer.state is raw.state and len(raw.state) == 2
    assert optimizer.param_groups is raw.param_groups
    assert not accelerator.optimizer_step_was_skipped


def test_trackers_log_through_the_accelerator_to_tensorboard(tmp_path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is a test dependency of x-runtime")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=tmp_path)
    accelerator.init_trackers("run1", config={"lr": 0.1, "epochs": 2})
    for step, loss in enumerate([1.5, 1.25, 1.0]):
        accelerator.log({"loss": loss}, step=step)
    assert accelerator.get_tracker("tensorboard").name == "tensorboard"
    accelerator.end_training()
    events = EventAccumulator(str(tmp_path / "run1"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 1.5), (1, 1.25), (2, 1.0)]
    with pytest.raises(ValueError, match="no tracker named 'wandb'"):
        accelerator.get_tracker("wandb")


@pytest.mark.parametrize("compiled", [False, True])
def test_unwrap_model_takes_the_model_out_of_data_parallel(compiled: bool) -> None:
    # Accelerate's unwrap_model (extract_model_from_parallel) unwraps torch.nn.DataParallel as DDP.
    inner = torch.nn.Linear(2, 2)
    wrapped = torch.nn.DataParallel(inner)
    if compiled:
        wrapped = torch.compile(wrapped)
    accelerator = Accelerator(cpu=True)
    assert accelerator.unwrap_model(wrapped, keep_torch_compile=False) is inner
    assert accelerator.unwrap_model(wrapped) is inner  # a compiled wrapper is not kept around the DataParallel


def test_preparing_a_prepared_model_again_returns_it() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = torch.nn.Linear(2, 2)
    prepared = accelerator.prepare_model(model)
    assert accelerator.prepare_model(prepared) is prepared
    assert accelerator.prepare_model(model) is prepared
    assert accelerator.prepare(model) is prepared and len(accelerator._prepared.models) == 1
    assert prepared(torch.ones(1, 2)).dtype == torch.float32  # the forward wrapped once, still works


def test_the_accelerators_of_a_process_share_one_exit_hook() -> None:
    # One collection at exit for all of them (one each made a process with 100 accelerators take
    # 4.3 s to exit), and every one's wrappers dropped before any group is left.
    import atexit

    from x_runtime.accelerator.prepared import release_at_exit

    before = atexit._ncallbacks()
    made = [Accelerator(cpu=True) for _ in range(3)]
    assert atexit._ncallbacks() - before <= 1
    assert all(any(ref() is a._prepared for ref, _ in release_at_exit._entries) for a in made)


def test_the_exit_hook_drops_every_wrapper_before_leaving_the_group_once() -> None:
    import atexit

    from x_runtime.accelerator.prepared import ExitRelease, PreparedObjects

    events: list[str] = []

    class State:
        def destroy(self) -> None:
            events.append(f"destroy {len(first.models)} {len(second.models)}")

    first, second, shared = PreparedObjects(), PreparedObjects(), State()
    first.models.append(torch.nn.Linear(1, 1))
    second.models.append(torch.nn.Linear(1, 1))
    hook = ExitRelease()
    hook.add(first, shared)
    hook.add(second, shared)
    atexit.unregister(hook.run)  # a test's own hook: not for this process's exit
    hook.run()
    assert events == ["destroy 0 0"]  # both emptied first, the shared state left once
