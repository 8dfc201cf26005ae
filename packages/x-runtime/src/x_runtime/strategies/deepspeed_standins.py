"""What a training loop holds where DeepSpeed owns the real thing: Accelerate's DeepSpeed helper classes.

- ``HfDeepSpeedConfig``: a DeepSpeed config (file, dict, JSON or base64 text) to query by dotted
  key (``"zero_optimization.stage"``); transformers subclasses it for ``Trainer`` and keeps one alive
  so that ``from_pretrained`` builds a ZeRO-3 model partitioned.
- ``DummyOptim`` / ``DummyScheduler``: stand-ins passed to ``prepare`` when the DeepSpeed config
  names the optimizer or the scheduler; the engine builds the real ones from the config.
- ``DeepSpeedOptimizerWrapper`` / ``DeepSpeedSchedulerWrapper``: what ``prepare`` returns for them
  under DeepSpeed; their ``step`` and ``zero_grad`` do nothing, since the engine steps inside
  ``backward`` (transformers tells them apart with ``isinstance``).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from x_runtime.data.gradient_state import GradientState
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler

__all__ = [
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "is_file",
    "read_deepspeed_config",
]

_OFFLOAD_DEVICES = ("cpu", "nvme")


def read_deepspeed_config(source: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    """A DeepSpeed config as a dict of its own: from a dict (copied), a JSON file, JSON text or base64 JSON.

    Raises:
        ValueError: none of these (the message says what was expected).

    Examples:
        >>> read_deepspeed_config('{"zero_optimization": {"stage": 3}}')
        {'zero_optimization': {'stage': 3}}
    """
    if isinstance(source, dict):
        return copy.deepcopy(source)
    text = os.fspath(source)
    if is_file(text):
        try:
            loaded = json.loads(Path(text).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"DeepSpeed config {text}, line {exc.lineno}: not valid JSON ({exc.msg})") from None
    else:
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError:
            try:
                loaded = json.loads(base64.urlsafe_b64decode(text).decode("utf-8"))
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise ValueError(
                    f"expected a DeepSpeed config: a path to an existing JSON file, a dict, or JSON (or base64 JSON) "
                    f"text; got {text[:80]!r}"
                ) from None
    if not isinstance(loaded, dict):
        raise ValueError(f"a DeepSpeed config is a JSON object; got {type(loaded).__name__}")
    return loaded


def is_file(text: str) -> bool:
    """Whether ``text`` names an existing file (``False`` for text too long to be a file name)."""
    try:
        return Path(text).is_file()
    except OSError:  # JSON text longer than a file name may be ("File name too long")
        return False


class HfDeepSpeedConfig:
    """A DeepSpeed config, queried by dotted keys.

    Examples:
        >>> config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
        >>> config.is_zero3(), config.is_offload(), config.get_value("zero_optimization.stage")
        (True, True, 3)
        >>> config.get_value("optimizer.params.lr", 0.1), config.is_true("fp16.enabled")
        (0.1, False)
    """

    def __init__(self, config_file_or_dict: str | os.PathLike[str] | dict[str, Any]) -> None:
        self.config = read_deepspeed_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage and whether anything is offloaded (again, after the config changed)."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {
            self.get_value("zero_optimization.offload_optimizer.device"),
            self.get_value("zero_optimization.offload_param.device"),
        }
        self._offload = (self.is_zero2() or self.is_zero3()) and bool(devices & set(_OFFLOAD_DEVICES))

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of ``ds_key_long``, and that part (``None`` when a parent is missing)."""
        *parents, key = ds_key_long.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, key
        return node, key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the section ``ds_key_long``; a missing one is an error only with ``must_exist``."""
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        """Whether the value is set and true (unset is ``False``)."""
        value = self.get_value(ds_key_long)
        return value is not None and bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """Whether the value is set and false (unset is ``False`` here too)."""
        value = self.get_value(ds_key_long)
        return value is not None and not bool(value)

    def is_zero2(self) -> bool:
        return bool(self._stage == 2)

    def is_zero3(self) -> bool:
        return bool(self._stage == 3)

    def is_offload(self) -> bool:
        return bool(self._offload)


class DummyOptim:
    """The optimizer to pass to ``prepare`` when the DeepSpeed config's ``optimizer`` section builds the real one.

    Args:
        params: the model's parameters or parameter groups.
        lr: learning rate, filled into the config's ``"auto"`` lr.
        weight_decay: filled into the config's ``"auto"`` weight decay.
        **kwargs: kept as ``kwargs``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """The scheduler to pass to ``prepare`` when DeepSpeed builds the real one.

    Args:
        optimizer: the ``DummyOptim`` (or optimizer) it schedules.
        total_num_steps: filled into the config's ``"auto"`` total steps.
        warmup_num_steps: filled into the config's ``"auto"`` warm-up steps.
        lr_scheduler_callable: builds the scheduler from the engine's optimizer, when the config has
            no ``scheduler`` section.
        **kwargs: kept as ``kwargs``.
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The engine's optimizer as ``prepare`` returns it: ``step`` and ``zero_grad`` are the engine's business."""

    def __init__(self, optimizer: torch.optim.Optimizer, gradient_state: GradientState | None = None) -> None:
        super().__init__(optimizer, gradient_state=gradient_state or GradientState())
        self.steps_in_backward = True

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        return None  # the engine zeroes after its step, inside backward

    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # the engine's step takes no closure
        return None  # the engine steps inside backward

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine skipped its last step (fp16 overflow)."""
        return bool(getattr(self.optimizer, "overflow", False))


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The engine's scheduler as ``prepare`` returns it: the engine steps it inside ``backward``."""

    def __init__(self, scheduler: Any, optimizers: Any, gradient_state: GradientState | None = None) -> None:
        optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        super().__init__(scheduler, optimizers, gradient_state=gradient_state or GradientState())

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None  # the engine steps it
