"""Capabilities are declared on the ``Strategy`` Protocol, and every strategy declares them.

Checkpointing asks a strategy what it can do (``writes_from_state_dicts``, ``load_device``)
instead of comparing its methods with the plain-PyTorch defaults: a strategy that overrides a
hook but still writes plain state dicts keeps its asynchronous saves, and one that declares it
gathers with collectives never gets a background write.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from x_runtime import Accelerator
from x_runtime.checkpoint.snapshot import copies_in_background
from x_runtime.strategies.base import Strategy
from x_runtime.strategies.ddp import DDPStrategy
from x_runtime.strategies.deepspeed import DeepSpeedStrategy
from x_runtime.strategies.defaults import StrategyDefaults
from x_runtime.strategies.fsdp import FSDPStrategy
from x_runtime.strategies.xla import XLAStrategy

BUILT_IN = [StrategyDefaults, DDPStrategy, FSDPStrategy, DeepSpeedStrategy, XLAStrategy]


def protocol_members() -> set[str]:
    declared = {name for name, _ in inspect.getmembers(Strategy) if not name.startswith("_")}
    return declared | set(Strategy.__annotations__)


def test_the_protocol_declares_what_checkpointing_calls() -> None:
    assert {"writes_from_state_dicts", "load_device", "to_host", "save_model_files"} <= protocol_members()


@pytest.mark.parametrize("kind", BUILT_IN, ids=lambda k: k.__name__)
def test_every_strategy_has_every_member_of_the_protocol(kind: type) -> None:
    missing = sorted(name for name in protocol_members() if not hasattr(kind, name))
    assert missing == [], f"{kind.__name__} lacks {missing}"


@pytest.mark.parametrize(
    ("kind", "background"),
    [
        (StrategyDefaults, True),
        (DDPStrategy, True),
        (FSDPStrategy, False),
        (DeepSpeedStrategy, False),
        (XLAStrategy, False),
    ],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_which_strategies_save_in_the_background(kind: type, background: bool) -> None:
    assert copies_in_background(kind.__new__(kind)) is background


class LoggingDDP(DDPStrategy):
    """Overrides a weights hook, still writing plain state dicts: its saves may run in the background."""

    written: ClassVar[list[str]] = []

    def save_model_files(self, folder: Path, name: str, model: torch.nn.Module, **kwargs: Any) -> dict[str, Any]:
        self.written.append(name)
        return super().save_model_files(folder, name, model, **kwargs)


def test_an_overridden_hook_keeps_the_declared_capability(tmp_path: Path) -> None:
    # Before capabilities were declared, any override of save_model_files made saves synchronous.
    assert copies_in_background(LoggingDDP.__new__(LoggingDDP))
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    strategy = LoggingDDP.__new__(LoggingDDP)
    strategy.__dict__.update(accelerator.strategy.__dict__)
    accelerator.strategy = strategy
    before = model.weight.detach().clone()
    accelerator.save_state(tmp_path / "c", async_save=True)
    with torch.no_grad():
        model.weight.add_(1)  # after save_state returned: not in the checkpoint
    assert accelerator.wait_for_checkpoint() == str(tmp_path / "c")
    assert LoggingDDP.written == ["model"]
    accelerator.load_state(tmp_path / "c")
    assert torch.equal(model.weight, before)
