"""The prepared optimizer and scheduler: boundaries, fp16 overflow skips, per-process stepping."""

from __future__ import annotations

import pytest
import torch

from x_runtime.data.gradient_state import GradientState
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler


def _setup(scaler=None, num_processes=1, split_batches=False):
    weight = torch.nn.Parameter(torch.ones(2))
    raw = torch.optim.SGD([weight], lr=1.0)
    state = GradientState()
    optimizer = AcceleratedOptimizer(raw, gradient_state=state, scaler=scaler)
    scheduler = AcceleratedScheduler(
        torch.optim.lr_scheduler.LambdaLR(raw, lambda step: 1.0 / (step + 1)),
        [optimizer],
        gradient_state=state,
        num_processes=num_processes,
        split_batches=split_batches,
    )
    return weight, optimizer, scheduler, state


def test_off_boundary_step_and_zero_grad_do_nothing() -> None:
    weight, optimizer, scheduler, state = _setup()
    weight.grad = torch.ones(2)
    state.sync_gradients = False
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    assert weight.tolist() == [1.0, 1.0] and weight.grad is not None
    assert scheduler.get_last_lr() == [1.0]
    state.sync_gradients = True
    optimizer.step()
    assert weight.tolist() == [0.0, 0.0]


def test_fp16_overflow_skips_the_step_and_the_scheduler() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    weight, optimizer, scheduler, _ = _setup(scaler)
    scaler.scale(weight.sum()).backward()
    optimizer.step()
    scheduler.step()
    assert not optimizer.step_was_skipped and weight.tolist() == [0.0, 0.0]
    assert scheduler.get_last_lr() == [0.5]
    weight.grad = torch.tensor([float("inf"), 1.0])
    optimizer.step()
    scheduler.step()
    assert optimizer.step_was_skipped and weight.tolist() == [0.0, 0.0]
    assert scaler.get_scale() == 512.0 and scheduler.get_last_lr() == [0.5]


def test_unscale_happens_once_per_step() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    weight, optimizer, _, _ = _setup(scaler)
    scaler.scale(weight.sum()).backward()
    assert weight.grad.tolist() == [8.0, 8.0]
    optimizer.unscale()
    optimizer.unscale()  # a second call (e.g. clip after clip) must not raise or divide again
    assert weight.grad.tolist() == [1.0, 1.0]
    optimizer.step()


def test_unscaling_an_accumulating_step_under_a_scaler_is_refused() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    weight, optimizer, _, state = _setup(scaler)
    state.sync_gradients = False
    scaler.scale(weight.sum()).backward()
    with pytest.raises(RuntimeError, match=r"accumulates them under fp16: clip only when accelerator.sync_gradients"):
        optimizer.unscale()
    assert weight.grad.tolist() == [8.0, 8.0]  # nothing divided: the next backward adds like to like
    scaler.scale(weight.sum()).backward()
    state.sync_gradients = True
    optimizer.unscale()
    assert weight.grad.tolist() == [2.0, 2.0]
    optimizer.step()
    assert weight.tolist() == [-1.0, -1.0]


class _EngineOptimizer(torch.optim.SGD):
    """Stands in for DeepSpeed's fp16 optimizer: it steps inside backward and says if it overflowed."""

    overflow = False


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # the engine stepped
def test_a_step_the_strategy_skipped_inside_backward_holds_the_scheduler() -> None:
    weight, optimizer, scheduler, _ = _setup()
    engine_optimizer = _EngineOptimizer([weight], lr=1.0)
    optimizer.optimizer, optimizer.steps_in_backward = engine_optimizer, True
    engine_optimizer.overflow = True
    scheduler.step()
    assert optimizer.step_was_skipped and scheduler.get_last_lr() == [1.0]
    engine_optimizer.overflow = False
    scheduler.step()
    assert not optimizer.step_was_skipped and scheduler.get_last_lr() == [0.5]


@pytest.mark.parametrize(("processes", "split", "expected"), [(1, False, 0.5), (4, False, 0.2), (4, True, 0.5)])
def test_scheduler_advances_once_per_process_without_split_batches(processes, split, expected) -> None:
    weight, optimizer, scheduler, _ = _setup(num_processes=processes, split_batches=split)
    weight.grad = torch.zeros(2)
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr() == [pytest.approx(expected)]


def test_wrappers_expose_the_wrapped_objects() -> None:
    _, optimizer, scheduler, _ = _setup()
    assert optimizer.param_groups[0]["lr"] == 1.0 and optimizer.defaults["lr"] == 1.0
    assert scheduler.last_epoch == 0  # attribute of the wrapped scheduler
    restored = _setup()[2]
    restored.load_state_dict(scheduler.state_dict())
    assert restored.get_last_lr() == scheduler.get_last_lr()
