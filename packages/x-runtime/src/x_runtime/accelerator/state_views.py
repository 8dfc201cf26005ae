"""``PartialState``, ``AcceleratorState`` and ``GradientState`` with Accelerate's names, as views.

Accelerate keeps one shared state per process (a class-level dictionary every instance reads).
Here each view wraps one ``ProcessState`` and nothing is shared: ``accelerator.state`` is an
``AcceleratorState`` over that accelerator's own process state, and two accelerators in one
process stay independent. ``PartialState()`` or ``AcceleratorState()`` built on their own read
the environment as an ``Accelerator`` does and join (or adopt) torch's process group, the one
thing that is shared, so they agree with any accelerator of the same process.

Accelerate's names are read-through: ``process_index`` is the process state's ``rank``,
``num_processes`` its ``world_size``, ``local_process_index`` its ``local_rank``; any other
attribute of the ``ProcessState`` (``rank``, ``world_size``, ``source``...) reads and writes
through as well. ``_reset_state()`` exists and does nothing: there is no shared state to reset.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any, TypeVar

import torch.distributed as dist

from x_common import env
from x_runtime.core.settings import current_settings
from x_runtime.data.gradient_state import GradientState as LoopGradientState
from x_runtime.process.collectives.debug import debug_mode, set_debug_mode
from x_runtime.process.operations.on_ranks import first_on, on_process, split_between_processes
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.select import decide

__all__ = ["AcceleratorState", "GradientState", "PartialState", "remember_accelerator_state"]

# Accelerate's spelling -> the ProcessState field it reads.
_ALIASES = {"process_index": "rank", "num_processes": "world_size", "local_process_index": "local_rank"}
_FIELDS = frozenset(f.name for f in fields(ProcessState))
# ``view_of`` returns the class it is called on (typing.Self is 3.11+).
_View = TypeVar("_View", bound="PartialState")


class PartialState:
    """Where this process runs, with Accelerate's attribute and method names.

    Args:
        cpu: compute on CPU even when an accelerator is present.
        kwargs: ``backend``, ``init_method`` and ``timeout`` for the process group, as
            Accelerate's ``PartialState`` takes them.

    Examples:
        >>> state = PartialState(cpu=True)
        >>> state.num_processes, state.process_index, state.is_main_process
        (1, 0, True)
    """

    _process: ProcessState
    # Accelerate's class-level shared dictionary, always empty here (scripts test it against {}).
    _shared_state: Mapping[str, Any] = MappingProxyType({})

    def __init__(self, cpu: bool = False, **kwargs: Any):
        choice = decide(
            backend=kwargs.get("backend"), init_method=kwargs.get("init_method"), timeout=kwargs.get("timeout")
        )
        object.__setattr__(self, "_process", choice.join(cpu=cpu, partial=True))

    @classmethod
    def view_of(cls: type[_View], process: ProcessState, **extra: Any) -> _View:
        """A view over an existing ``ProcessState`` (what ``accelerator.state`` is)."""
        view = cls.__new__(cls)
        object.__setattr__(view, "_process", process)
        for name, value in extra.items():
            object.__setattr__(view, name, value)
        return view

    @property
    def process_state(self) -> ProcessState:
        """The ``ProcessState`` this view reads."""
        return self._process

    # --- read-through ---------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_process":
            raise AttributeError(name)
        return getattr(self._process, _ALIASES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        target = _ALIASES.get(name, name)
        if target in _FIELDS:
            setattr(self._process, target, value)
        else:
            object.__setattr__(self, name, value)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def initialized(self) -> bool:
        return True

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Accelerate clears its shared state here; views share nothing, so nothing happens."""

    @property
    def distributed_type(self) -> str:
        return self._process.distributed_type

    @property
    def use_distributed(self) -> bool:
        return self.distributed_type != DistributedType.NO and self._process.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self._process.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self._process.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self._process.rank == self._process.world_size - 1

    @property
    def fork_launched(self) -> bool:
        return False

    @property
    def default_device(self) -> Any:
        return self._process.device

    @property
    def debug(self) -> bool:
        """Whether collectives check shapes across ranks first (``X_DEBUG_MODE``, or set here)."""
        return debug_mode()

    @debug.setter
    def debug(self, on: bool) -> None:
        # Accelerate's test scripts switch it on this way before calling the free collectives.
        set_debug_mode(on)

    # --- running code on some processes ---------------------------------------------------
    def wait_for_everyone(self) -> None:
        self._process.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return first_on(self._process, self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return first_on(self._process, self.is_local_main_process)

    def _on(self, predicate: Callable[[ProcessState], bool], function: Callable[..., Any] | None) -> Any:
        decorate = on_process(self._process, predicate)
        return decorate if function is None else decorate(function)

    def on_main_process(self, function: Callable[..., Any] | None = None) -> Any:
        return self._on(lambda s: s.rank == 0, function)

    def on_local_main_process(self, function: Callable[..., Any] | None = None) -> Any:
        return self._on(lambda s: s.local_rank == 0, function)

    def on_last_process(self, function: Callable[..., Any]) -> Any:
        return self._on(lambda s: s.rank == s.world_size - 1, function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        if process_index is None:
            raise ValueError("on_process needs process_index, e.g. @state.on_process(process_index=1)")
        return self._on(lambda s: s.rank == process_index, function)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        if local_process_index is None:
            raise ValueError("on_local_process needs local_process_index")
        return self._on(lambda s: s.local_rank == local_process_index, function)

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        """This process's contiguous share of a list, tuple, tensor, dict or ``datasets.Dataset``."""
        if hasattr(inputs, "select") and hasattr(inputs, "column_names"):  # a datasets.Dataset
            return _split_dataset(self._process, inputs, apply_padding)
        return split_between_processes(self._process, inputs, apply_padding=apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Leave torch's process group (``group``, or the default one)."""
        if dist.is_initialized():
            dist.destroy_process_group(group)
        if group is None:
            self._process.owns_process_group = False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        process = self._process
        backend = f"  Backend: {process.backend}" if process.backend else ""
        return (
            f"Distributed environment: {_as_accelerate_formats(self.distributed_type)}{backend}\n"
            f"Num processes: {process.world_size}\n"
            f"Process index: {process.rank}\n"
            f"Local process index: {process.local_rank}\n"
            f"Device: {process.device}\n"
        )


def _as_accelerate_formats(distributed_type: str) -> str:
    """``distributed_type`` as Accelerate's ``f"{state.distributed_type}"`` prints it.

    Accelerate's ``DistributedType`` is a ``(str, Enum)``: Python 3.11 made ``format()`` of such
    an enum follow its ``str()`` (``DistributedType.NO``), 3.10 gives the value (``NO``). x's
    names are plain strings, so the text is spelled out here to read as Accelerate's does on the
    same interpreter (scripts and logs compare it).
    """
    return f"DistributedType.{distributed_type}" if sys.version_info >= (3, 11) else distributed_type


@contextlib.contextmanager
def _split_dataset(process: ProcessState, dataset: Any, apply_padding: bool) -> Iterator[Any]:
    parts, index, length = process.world_size, process.rank, len(dataset)
    if parts == 1:
        yield dataset
        return
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    stop = start + base + (1 if index < extra else 0)
    rows = list(range(start, stop))
    if apply_padding and length and len(rows) < -(-length // parts):
        rows.append(rows[-1] if rows else length - 1)
    yield dataset.select(rows)


class AcceleratorState(PartialState):
    """``PartialState`` plus what the accelerator chose: mixed precision and the sharding plugins.

    ``accelerator.state`` is the one its accelerator made. Built on its own with nothing given, it
    reports the choices of this process's latest live ``Accelerator`` (its plugins and mixed
    precision), as Accelerate's one shared state does: libraries ask ``AcceleratorState()`` whether
    the run is under ZeRO-3 (TRL's reference-model sync) without holding the accelerator. With no
    accelerator alive, it reads the launcher's choices (``X_MIXED_PRECISION``, the distributed type).

    Examples:
        >>> AcceleratorState(cpu=True, mixed_precision="bf16").mixed_precision
        'bf16'
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        **kwargs: Any,
    ):
        given = (mixed_precision, dynamo_plugin, deepspeed_plugin, fsdp_plugin, *kwargs.values())
        latest = _latest[0]() if _latest else None
        if latest is not None and all(value is None for value in given) and not cpu:
            object.__setattr__(self, "_process", latest.process_state)
            self.__dict__.update({k: v for k, v in vars(latest).items() if k != "_process"})
            return
        choice = decide(
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugin=deepspeed_plugin,
            backend=kwargs.get("backend"),
            init_method=kwargs.get("init_method"),
            timeout=kwargs.get("timeout"),
        )
        object.__setattr__(self, "_process", choice.join(cpu=cpu))
        mode = current_settings().get(env.MIXED_PRECISION) if mixed_precision is None else str(mixed_precision)
        self.__dict__.update(
            _mixed_precision=mode,
            dynamo_plugin=dynamo_plugin,
            deepspeed_plugin=deepspeed_plugin,
            fsdp_plugin=fsdp_plugin,
        )

    @property
    def mixed_precision(self) -> str:
        mode: str = self.__dict__.get("_mixed_precision", "no")  # set as a str by __init__ or view_of
        return mode

    @property
    def is_fsdp2(self) -> bool:
        return self.distributed_type == DistributedType.FSDP

    def __getattr__(self, name: str) -> Any:
        if name in ("dynamo_plugin", "deepspeed_plugin", "fsdp_plugin", "parallelism_config", "device_mesh"):
            return None
        return super().__getattr__(name)

    def __repr__(self) -> str:
        return super().__repr__() + f"\nMixed precision type: {self.mixed_precision}\n"


# The latest Accelerator's state view in this process (a weak reference: it is the accelerator's to keep).
_latest: list[weakref.ref[AcceleratorState]] = []


def remember_accelerator_state(state: AcceleratorState) -> None:
    """Make ``state`` what ``AcceleratorState()`` built on its own reports (the ``Accelerator`` calls this)."""
    _latest[:] = [weakref.ref(state)]


class GradientState(LoopGradientState):
    """The loop's ``GradientState``, also built as Accelerate builds it (from a plugin).

    Args:
        gradient_accumulation_plugin: a ``GradientAccumulationPlugin`` (``num_steps``,
            ``adjust_scheduler``, ``sync_with_dataloader``), or None for one step.
        kwargs: x's own ``num_steps``, ``sync_with_dataloader``, ``adjust_scheduler``.

    Examples:
        >>> GradientState().sync_gradients
        True
    """

    def __init__(self, gradient_accumulation_plugin: Any = None, **kwargs: Any):
        plugin = gradient_accumulation_plugin
        if plugin is not None:
            kwargs.setdefault("num_steps", 1 if plugin.num_steps is None else plugin.num_steps)
            kwargs.setdefault("sync_with_dataloader", plugin.sync_with_dataloader)
            kwargs.setdefault("adjust_scheduler", plugin.adjust_scheduler)
        super().__init__(**kwargs)
        if plugin is not None:
            self.plugin_kwargs = plugin.to_kwargs()

    @property
    def initialized(self) -> bool:
        return True

    @staticmethod
    def _reset_state() -> None:
        """Accelerate clears its shared state here; each accelerator owns its own, so nothing happens."""
