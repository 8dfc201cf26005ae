"""Tensor parallelism: a model's layers split over the ``tp`` mesh by a plan of module names.

The plan maps module names (``*`` matches one level, as in transformers' plans) to how each is
split: torch's ``ParallelStyle`` objects (``ColwiseParallel()``, ``RowwiseParallel()``,
``SequenceParallel()``) or transformers' words for them (``"colwise"``, ``"rowwise"``,
``"colwise_gather_output"``, ``"embedding_rowwise"``, ...). It comes from the user
(``TorchTensorParallelConfig(plan=...)``), else from the model (transformers' ``tp_plan``,
``base_model_tp_plan`` in its config). Accelerate needs the model split before ``prepare``
(``from_pretrained(tp_plan="auto")``); x splits it in ``prepare`` with torch's
``parallelize_module``, so a model whose plan uses the styles below trains, loaded however it was.

Every parameter the plan leaves whole becomes a replicated ``DTensor`` on the same mesh (its
module takes and gives plain tensors as before), so the optimizer, gradient clipping and FSDP on
top see one mesh, not a mix of plain tensors and DTensors that their fused kernels refuse.

What the plan cannot split is refused before anything is touched, in one line: a name that
matches no module, a style on a module it does not apply to, sizes the degree does not divide,
attention heads the degree does not divide, a word x does not know.

Examples:
    >>> sorted(STYLES)[:3]
    ['colwise', 'colwise_gather_output', 'colwise_rep']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from x_runtime.strategies.layout import BadLayoutError

__all__ = ["STYLES", "apply_plan", "model_plan", "resolve_plan"]


def _colwise(**kwargs: Any) -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel(**kwargs)


def _rowwise(**kwargs: Any) -> Any:
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel(**kwargs)


def _replicate() -> Any:
    from torch.distributed.tensor import Replicate

    return Replicate()


def _sequence_parallel() -> Any:
    from torch.distributed.tensor.parallel import SequenceParallel

    return SequenceParallel()


# transformers' words for the splits torch's styles make (transformers.integrations.tensor_parallel).
STYLES: dict[str, Callable[[], Any]] = {
    "colwise": _colwise,
    "rowwise": _rowwise,
    "colwise_rep": lambda: _colwise(output_layouts=_replicate()),
    "colwise_gather_output": lambda: _colwise(output_layouts=_replicate()),
    "rowwise_rep": lambda: _rowwise(input_layouts=_replicate()),
    "embedding_rowwise": lambda: _rowwise(input_layouts=_replicate()),
    "sequence_parallel": _sequence_parallel,
}


def model_plan(model: torch.nn.Module) -> dict[str, Any]:
    """The plan the model carries (transformers' ``tp_plan``), keyed from the model's root; ``{}`` without one."""
    for attribute in ("tp_plan", "_tp_plan"):
        plan = getattr(model, attribute, None)
        if isinstance(plan, Mapping) and plan:
            return dict(plan)
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None)
    if isinstance(base, Mapping) and base:
        prefix = getattr(model, "base_model_prefix", "")
        inner = getattr(model, prefix, None) if prefix else None
        lead = f"{prefix}." if isinstance(inner, torch.nn.Module) and inner is not model else ""
        return {f"{lead}{name}": style for name, style in base.items()}
    return {}


def resolve_plan(model: torch.nn.Module, plan: Mapping[str, Any] | None, tp_size: int) -> dict[str, Any]:
    """``{module name: torch ParallelStyle}`` for each module the plan splits, checked against ``tp_size``.

    Raises:
        ValueError: no plan (the model has none and none was given), a name that matches no
            module, an unknown word, a style on a module it cannot split, or sizes ``tp_size``
            does not divide; one line each, naming the module.
    """
    given = dict(plan) if plan else model_plan(model)
    if not given:
        raise BadLayoutError(
            f"tensor parallelism (tp_size={tp_size}): {type(model).__name__} carries no tensor-parallel plan; "
            "pass one as ParallelismConfig(tp_handler=TorchTensorParallelConfig(plan={'layers.*.proj': 'colwise', ...}))"
        )
    modules = dict(model.named_modules())
    resolved: dict[str, Any] = {}
    for pattern, style in given.items():
        matcher = re.compile(re.escape(pattern).replace(r"\*", r"[^.]+") + r"\Z")
        names = [name for name in modules if name and matcher.match(name)]
        if not names:
            raise BadLayoutError(
                f"tensor parallelism: the plan names {pattern!r} but {type(model).__name__} has no such module; "
                "fix the plan's module names (printed by model.named_modules())"
            )
        for name in names:
            resolved[name] = _style(name, modules[name], style, tp_size)
    _check_heads(model, tp_size)
    return resolved


def _style(name: str, module: torch.nn.Module, style: Any, tp_size: int) -> Any:
    if isinstance(style, str):
        if style not in STYLES:
            known = ", ".join(sorted(STYLES))
            raise BadLayoutError(
                f"tensor parallelism: {name}: x does not split {style!r} layers (it splits {known}); "
                "give that module a torch ParallelStyle in the plan or leave it out"
            )
        style = STYLES[style]()
    kind = type(style).__name__
    if kind in ("ColwiseParallel", "RowwiseParallel"):
        if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            raise BadLayoutError(
                f"tensor parallelism: {name} is a {type(module).__name__}; {kind} splits Linear and Embedding layers only"
            )
        weight = module.weight
        # Linear weights are (out, in); an Embedding's (num, dim): colwise splits dim 0 of a Linear, dim 1 of an Embedding.
        linear = isinstance(module, torch.nn.Linear)
        dim = (0 if linear else 1) if kind == "ColwiseParallel" else (1 if linear else 0)
        size = int(weight.shape[dim])
        if size % tp_size:
            raise BadLayoutError(
                f"tensor parallelism: {name} ({kind}) has {size} {('rows', 'columns')[dim]} in its weight, "
                f"which tp_size={tp_size} does not divide; pick a tp_size that divides {size}"
            )
    return style


def _check_heads(model: torch.nn.Module, tp_size: int) -> None:
    config = getattr(model, "config", None)
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % tp_size:
            raise BadLayoutError(
                f"tensor parallelism: the model's {field}={heads} is not divisible by tp_size={tp_size}; "
                "each rank must hold whole attention heads"
            )


def apply_plan(model: torch.nn.Module, mesh: Any, plan: Mapping[str, Any]) -> torch.nn.Module:
    """Split ``model`` in place over ``mesh`` by the resolved ``plan``; replicate every parameter left whole."""
    from torch.distributed.tensor.parallel import parallelize_module

    tied = _tied(model)
    parallelize_module(model, mesh, dict(plan))
    _replicate_the_rest(model, mesh)
    _tie_again(tied)
    return model


def _tied(model: torch.nn.Module) -> list[list[tuple[torch.nn.Module, str]]]:
    """Each parameter held by several modules (tied embeddings), as its owners."""
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, name))
    return [group for group in owners.values() if len(group) > 1]


def _tie_again(tied: list[list[tuple[torch.nn.Module, str]]]) -> None:
    # Splitting registers a new parameter per module: a tied pair came out as two. Tied again, they
    # train as one, as in the model given (a vocab-parallel embedding and a colwise head both shard the
    # vocabulary's dimension, so one split serves both).
    for (first, first_name), *others in tied:
        kept = first._parameters[first_name]
        for module, name in others:
            other = module._parameters[name]
            if getattr(other, "placements", None) != getattr(kept, "placements", None):
                raise BadLayoutError(
                    f"tensor parallelism: {type(first).__name__}.{first_name} and {type(module).__name__}.{name} "
                    "share one weight (tied) but the plan splits them differently; give both the same split "
                    "(embedding_rowwise with colwise_gather_output) or neither"
                )
            module.register_parameter(name, kept)


def _replicate_the_rest(model: torch.nn.Module, mesh: Any) -> None:
    from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor

    def inputs(_module: torch.nn.Module, args: Any, device_mesh: Any) -> Any:
        return tuple(
            DTensor.from_local(a, device_mesh, [Replicate()], run_check=False) if _plain(a) else a for a in args
        )

    def outputs(_module: torch.nn.Module, result: Any, _device_mesh: Any) -> Any:
        return result.to_local() if isinstance(result, DTensor) else result

    # Listed first: each module whose own parameters are plain gets its inputs and outputs converted,
    # and only its own parameters replicated (a child's forward converts for itself).
    holders = [m for m in model.modules() if any(not isinstance(p, DTensor) for p in m.parameters(recurse=False))]
    for holder in holders:

        def partition(_name: str, module: torch.nn.Module, device_mesh: Any, target: torch.nn.Module = holder) -> None:
            if module is not target:
                return
            for key, param in list(module.named_parameters(recurse=False)):
                if not isinstance(param, DTensor):
                    held = distribute_tensor(param.detach(), device_mesh, [Replicate()])
                    module.register_parameter(key, torch.nn.Parameter(held, requires_grad=param.requires_grad))

        distribute_module(holder, mesh, partition, inputs, outputs)


def _plain(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
