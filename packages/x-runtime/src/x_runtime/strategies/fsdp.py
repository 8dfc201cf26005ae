"""FSDP2: ``fully_shard`` units chosen by layer class or size, with full or sharded checkpoints.

The layout (``strategies.layout``) gives the mesh: ``dp_shard`` (FSDP), ``dp_replicate`` x
``dp_shard`` (HSDP: shards within a replica group, gradients averaged across groups), and, with
``tp_size`` above one, the model's layers are split over the ``tp`` mesh first (``tp_plan``), so
each rank shards its tensor-parallel part.

Each rank keeps 1/N of every parameter as a ``DTensor``; a unit's parameters are gathered for
its forward and backward and freed after (``reshard_after_forward``). ``fully_shard`` replaces
the module's parameters with new objects, so an optimizer built before ``prepare`` is pointed at
the new ones (matched through weak references, never by recycled ``id``s).

Checkpoints: FULL_STATE_DICT gathers whole tensors on rank 0 (``model.safetensors`` and an
optimizer file keyed by parameter names, readable by a DDP or single-process run);
SHARDED_STATE_DICT writes ``<name>_sharded/`` through ``torch.distributed.checkpoint``, every
rank its own shards, loadable into any number of processes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from x_runtime.io.files import torch_load, torch_save
from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.defaults import (
    StrategyDefaults,
    check_shapes,
    load_full_weights,
    refuse_layout,
    save_full_weights,
    weights_file_name,
)
from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin
from x_runtime.strategies.layout import BadLayoutError, Layout
from x_runtime.strategies.param_moves import ParameterMoves
from x_runtime.strategies.sharded_files import (
    load_sharded_model,
    load_sharded_optimizer,
    save_sharded_model,
    save_sharded_optimizer,
)
from x_runtime.strategies.tp_plan import apply_plan, resolve_plan

__all__ = ["FSDPStrategy", "wrap_units"]

_REDISTRIBUTE = "torch.distributed.tensor._redistribute"  # the logger of DTensor's multi-step warnings


class FSDPStrategy(StrategyDefaults):
    distributed_type = "FSDP"
    writes_from_state_dicts = False  # sharded files, or full ones gathered with collectives
    record_name = "FSDP"  # what a checkpoint's manifest says wrote its parts

    def __init__(
        self, state: ProcessState, plugin: FullyShardedDataParallelPlugin, mixed_precision: str, layout: Layout
    ):
        self.state = state
        self.layout = layout
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
        except ImportError:
            raise ValueError(
                f"FSDP needs torch>=2.6 (fully_shard); this is torch {torch.__version__}: pip install -U torch"
            ) from None
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "FSDP needs a process group, but this process was started alone (no RANK/WORLD_SIZE from a "
                "launcher); start it with `x-launch --num_processes N script.py` or torchrun"
            )
        if plugin.cpu_offload and state.device.type == "cpu":
            raise ValueError(
                "FSDP cpu_offload (fsdp_offload_params) needs a GPU: this run computes on CPU, where parameters "
                "already live in CPU memory; set it to false"
            )
        self.plugin = plugin
        self.mp_policy = plugin.mixed_precision(mixed_precision)
        self.mesh = layout.fsdp_mesh
        self._moves = ParameterMoves()

    # --- prepare -----------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        # Meta models (cpu_ram_efficient_loading on ranks > 0) are materialised after sharding.
        return model if _on_meta(model) else model.to(self.state.device)

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        plugin = self.plugin
        units = wrap_units(model, plugin)
        on_meta = _on_meta(model)
        if on_meta and (self.state.is_main_process or not plugin.cpu_ram_efficient_loading):
            raise ValueError(
                "the model is on the meta device; under FSDP only ranks > 0 may pass a meta model, and only with "
                "cpu_ram_efficient_loading=True (rank 0 must hold the real weights)"
            )
        full = dict(model.state_dict()) if plugin.sync_module_states and self.state.is_main_process else {}
        before = list(model.parameters())
        self._split_layers(model)
        if plugin.activation_checkpointing:
            for unit in units:
                _recompute_in_backward(unit)
        ignored = _ignored_params(model, plugin.ignored_modules)
        options = {
            "mesh": self.mesh,
            "reshard_after_forward": plugin.reshard_after_forward,
            "mp_policy": self.mp_policy,
            "offload_policy": CPUOffloadPolicy() if plugin.cpu_offload else OffloadPolicy(),
            "ignored_params": ignored or None,
        }
        if self.layout.shards:
            # Innermost units first: fully_shard must see a unit's sub-units already sharded.
            for unit in reversed(units):
                fully_shard(unit, **options)
            fully_shard(model, **options)
        if on_meta:
            model.to_empty(device=self.state.device)
        if plugin.sync_module_states:
            self._sync_from_rank0(model, full)
        self._moves.record(before, model.parameters())
        return model

    def _split_layers(self, model: torch.nn.Module) -> None:
        """Tensor parallelism first: each rank then shards (FSDP) the part of every layer it holds."""
        mesh = self.layout.tp_mesh
        if mesh is None:
            return
        # Meta weights (cpu_ram_efficient_loading on ranks > 0) are neither sent nor received by torch's
        # split, which would leave rank 0 waiting: every rank learns whether any holds them.
        flag = torch.tensor([1.0 if _on_meta(model) else 0.0], device=self.state.device)
        dist.all_reduce(flag)
        if flag.item() > 0:
            raise BadLayoutError(
                "tensor parallelism splits the weights each rank holds, and some ranks hold meta weights "
                "(cpu_ram_efficient_loading): set fsdp_cpu_ram_efficient_loading to false with tp_size > 1"
            )
        config = self.layout.config
        handler = config.tp_handler if config is not None else None
        plan = resolve_plan(model, getattr(handler, "plan", None), self.layout.tp_size)
        apply_plan(model, mesh, plan)

    def _sync_from_rank0(self, model: torch.nn.Module, full: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        # torch types it dict[str, ValueType]; dict is invariant, so a dict of tensors does not match.
        set_model_state_dict(model, full, options=options)  # type: ignore[arg-type]
        # Buffers outside the state dict (non-persistent, e.g. rotary tables) travel separately.
        persistent = set(model.state_dict())
        for name, buffer in model.named_buffers():
            if name not in persistent and isinstance(buffer, torch.Tensor):
                dist.broadcast(buffer, src=0)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return self._moves.repoint(optimizer)

    # --- the step ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        setter = getattr(model, "set_requires_gradient_sync", None)
        if setter is None:
            yield
            return
        setter(False)
        try:
            yield
        finally:
            setter(True)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        # On a 2-D mesh (FSDP x TP) the norm is reduced over each dimension in turn, which torch logs on
        # every rank at every step; the result is the same.
        with _quiet(_REDISTRIBUTE):
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
            return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    # --- weights -----------------------------------------------------------------------------
    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Whole tensors on the main process (``{}`` elsewhere); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # Parameters split by TP and sharded by FSDP gather in two all-gathers, which torch logs as a warning
        # on every rank at every save: the layout's cost, said in the layouts page instead.
        with _quiet(_REDISTRIBUTE):
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # torch types the values as any state-dict value; full_state_dict=True gathers them into plain tensors.
        return cast("dict[str, torch.Tensor]", full)

    def _sharded_layout(self) -> bool:
        return self.plugin.state_dict_type == "SHARDED_STATE_DICT"

    def save_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, *, writer: bool, safe_serialization: bool = True
    ) -> dict[str, Any]:
        # Shards (or the gathered whole on rank 0) follow this strategy's own rule, not ``writer``.

        if self._sharded_layout():
            save_sharded_model(folder / f"{name}_sharded", model)
            return {"layout": "sharded", "strategy": self.record_name}
        weights = self.state_dict(model)
        file = weights_file_name(name, safe_serialization)
        if self.state.is_main_process:
            save_full_weights(weights, folder / file)
        return {"layout": "full", "strategy": "FSDP", "file": file}

    def load_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, record: dict[str, Any], strict: bool
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        if record.get("layout", "full") == "sharded":
            load_sharded_model(folder / f"{name}_sharded", model, strict=strict)
            return
        refuse_layout(record, "full", folder)
        weights: dict[str, torch.Tensor] = {}
        if self.state.is_main_process:
            path = folder / record.get("file", weights_file_name(name, True))
            weights = load_full_weights(path)
            check_shapes(path, weights, model.state_dict())
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
        # torch types it dict[str, ValueType]; dict is invariant, so a dict of tensors does not match.
        set_model_state_dict(model, weights, options=options)  # type: ignore[arg-type]

    def save_optimizer_files(
        self, folder: Path, name: str, optimizer: Any, model: Any, *, writer: bool
    ) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        inner = getattr(optimizer, "optimizer", optimizer)
        if self._sharded_layout():
            save_sharded_optimizer(folder / f"{name}_sharded", optimizer, model)
            return {"layout": "sharded", "strategy": self.record_name}
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_optimizer_state_dict(model, inner, options=options)
        if self.state.is_main_process:
            torch_save(state, folder / f"{name}.bin")
        return {"layout": "full", "strategy": "FSDP"}

    def load_optimizer_files(self, folder: Path, name: str, optimizer: Any, model: Any, record: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        inner = getattr(optimizer, "optimizer", optimizer)
        if record.get("layout", "full") == "sharded":
            load_sharded_optimizer(folder / f"{name}_sharded", optimizer, model)
            return
        refuse_layout(record, "full", folder)
        state, problem = {}, None
        if self.state.is_main_process:
            try:
                state = _keyed_by_name(torch_load(folder / f"{name}.bin"), inner, model)
            except ValueError as error:
                problem = str(error)
        # Said on every rank before the broadcast the others would otherwise wait in.
        told = [problem]
        dist.broadcast_object_list(told, src=0)
        if told[0] is not None:
            raise ValueError(told[0])
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, inner, state, options=options)


def _keyed_by_name(state: dict[str, Any], optimizer: Any, model: torch.nn.Module) -> dict[str, Any]:
    """An optimizer state keyed by position (``optimizer.state_dict()`` of a plain or DDP run) keyed by name.

    torch's ``set_optimizer_state_dict`` reads whole states by parameter name; a state written by
    one process numbers the parameters in the optimizer's order, which is the same order here.
    """
    if not any(isinstance(key, int) for key in state.get("state", {})) and all(
        not group["params"] or isinstance(group["params"][0], str) for group in state.get("param_groups", [])
    ):
        return state
    # torch.compile's wrapper adds "_orig_mod." to the names; torch's state-dict functions drop it.
    names = {id(param): name.replace("_orig_mod.", "") for name, param in model.named_parameters()}
    order = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    numbered = state["param_groups"]
    if sum(len(group["params"]) for group in numbered) != len(order):
        raise ValueError(
            f"the saved optimizer state has {sum(len(g['params']) for g in numbered)} parameters but this "
            f"optimizer trains {len(order)}; prepare the same model and optimizer as the run that saved it"
        )
    position = {index: order[i] for i, index in enumerate(p for g in numbered for p in g["params"])}
    return {
        "state": {position[int(key)]: value for key, value in state["state"].items()},
        "param_groups": [{**group, "params": [position[p] for p in group["params"]]} for group in numbered],
    }


def wrap_units(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin) -> list[torch.nn.Module]:
    """The submodules sharded as their own units, outermost first (the root is not included).

    Raises:
        ValueError: layer class names that no submodule has, or a class policy without names.
    """
    policy = plugin.auto_wrap_policy
    if callable(policy):
        return [m for m in model.modules() if m is not model and policy(m)]
    if policy in (None, "no_wrap"):
        return []
    if policy == "size_based_wrap":
        assert plugin.min_num_params is not None  # the plugin's __post_init__ fills it from the environment's default
        return _units_by_size(model, int(plugin.min_num_params))
    names = plugin.layer_class_names(model)
    return [m for m in model.modules() if m is not model and type(m).__name__ in names]


def _units_by_size(model: torch.nn.Module, min_num_params: int) -> list[torch.nn.Module]:
    # FSDP1's size policy: after its children, a module becomes a unit when the parameters not
    # yet in a unit reach the threshold.
    units: list[torch.nn.Module] = []

    def remaining(module: torch.nn.Module) -> int:
        count = sum(remaining(child) for child in module.children())
        count += sum(p.numel() for p in module.parameters(recurse=False))
        if module is not model and count >= min_num_params:
            units.append(module)
            return 0
        return count

    remaining(model)
    ordered = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(units, key=lambda m: ordered[id(m)])


def _recompute_in_backward(unit: torch.nn.Module) -> None:
    # Replacing forward (not wrapping the module) keeps parameter names, hence checkpoints, as they are.
    from torch.utils.checkpoint import checkpoint

    original = unit.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(original, *args, use_reentrant=False, **kwargs)

    unit.forward = forward


def _ignored_params(model: torch.nn.Module, ignored: Any) -> set[torch.nn.Parameter]:
    if ignored is None:
        return set()
    modules = [m for m in model.modules() if ignored(m)] if callable(ignored) else list(ignored)
    return {p for m in modules for p in m.parameters()}


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _on_meta(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))
