"""The model as one tensor-parallel rank holds it: the model's own TP plan applied to a meta copy.

transformers models carry their tensor-parallel plan (``model._tp_plan``: the config's
``base_model_tp_plan`` under the base model's prefix, plus the task class's own, e.g. Llama's
``lm_head: colwise_gather_output``). ``tp_degrees`` says which degrees the plan splits evenly;
``tp_local`` builds, on the meta device, the model one rank of a degree holds, so the ordinary
simulated step (``simulate/step.py``) runs it as it runs the whole model:

- ``colwise`` Linear layers keep ``out_features / tp`` rows (their bias too), ``rowwise`` ones
  ``in_features / tp`` columns (their bias whole: it is added after the reduction),
  ``embedding_rowwise`` tables ``num_embeddings / tp`` rows; attention then runs ``heads / tp``
  query and key-value heads, as the narrower projections give them;
- what TP adds that one rank's model lacks is allocated where the collectives allocate it: a
  rowwise layer's (and a vocab-parallel embedding's) output is all-reduced into a new full-size
  tensor in forward; a colwise layer's input gradient is all-reduced into a new tensor in
  backward; ``colwise_gather_output`` gathers the full-width output (the whole logits of a head)
  and hands its backward a contiguous local slice of the gradient.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
    ...                      num_key_value_heads=2, intermediate_size=128, vocab_size=1000)
    >>> with torch.device("meta"):
    ...     model = LlamaForCausalLM(config)
    >>> tp_degrees(model, config, 8)
    ([2], ['tp=4: do not divide the 2 key-value heads', 'tp=8: do not divide the 4 attention heads'])
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["STYLES", "tp_degrees", "tp_local", "tp_plan"]

# transformers' style names -> how one rank's module differs: which dimension is split. Only the
# styles x-runtime applies (its strategies/tp_plan.py): a plan with others gets no TP rows, so
# --plan never proposes a layout the run would refuse.
STYLES = {
    "colwise": "colwise",
    "colwise_gather_output": "gather",
    "colwise_rep": "gather",
    "rowwise": "rowwise",
    "rowwise_rep": "rowwise",
    "embedding_rowwise": "embedding",
}
_HEAD_ATTRIBUTES = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads")


def tp_plan(model: torch.nn.Module) -> dict[str, str]:
    """{module pattern: style} of ``model`` (``*`` stands for a block's index); {} without a plan."""
    plan = getattr(model, "_tp_plan", None)
    if plan:
        return dict(plan)
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    if base and prefix and hasattr(model, prefix):
        return {f"{prefix}.{k}": v for k, v in base.items()}
    return dict(base)


def _modules(model: torch.nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """{module name: style} for every module the plan names."""
    patterns = [(re.compile("^" + re.escape(p).replace(r"\*", r"[^.]+") + "$"), s) for p, s in plan.items()]
    found = {}
    for name, _ in model.named_modules():
        style = next((s for pattern, s in patterns if pattern.match(name)), None)
        if style is not None:
            found[name] = style
    return found


def _heads(config: Any) -> tuple[int | None, int | None]:
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    heads = getattr(text, "num_attention_heads", None)
    kv = getattr(text, "num_key_value_heads", None) or heads
    return heads, kv


def _split_size(module: torch.nn.Module, kind: str) -> int | None:
    """The dimension ``kind`` divides, or None for a module this module cannot split."""
    if kind in ("colwise", "gather") and type(module) is torch.nn.Linear:
        return module.out_features
    if kind == "rowwise" and type(module) is torch.nn.Linear:
        return module.in_features
    if kind == "embedding" and type(module) is torch.nn.Embedding:
        return module.num_embeddings
    return None


def tp_degrees(model: torch.nn.Module, config: Any, gpus: int) -> tuple[list[int], list[str]]:
    """The TP degrees (2, 4, 8, ... dividing ``gpus``) whose split of ``model`` is even, and why
    the others (or all) are not offered.

    A degree must divide the attention heads and key-value heads and every dimension the plan
    splits (intermediate size, vocabulary); a model without a plan, or with a style this module
    does not model, gets none.
    """
    plan = tp_plan(model)
    if not plan:
        return [], [f"{type(model).__name__} has no tensor-parallel plan (config.base_model_tp_plan): no TP rows"]
    unknown = sorted({s for s in plan.values() if s not in STYLES})
    if unknown:
        return [], [f"its TP plan uses {', '.join(unknown)}, which x-estimate does not model: no TP rows"]
    modules = _modules(model, plan)
    named = dict(model.named_modules())
    sizes = {}
    for name, style in modules.items():
        kind = STYLES[style]
        size = _split_size(named[name], kind)
        if size is None:
            what = type(named[name]).__name__
            return [], [f"its TP plan splits {name} ({what}) as {style}, which x-estimate does not model: no TP rows"]
        sizes[name] = size
    if not sizes:
        return [], [f"its TP plan names no module of {type(model).__name__}: no TP rows"]
    heads, kv = _heads(config)
    candidates = [d for d in range(2, gpus + 1) if gpus % d == 0 and d & (d - 1) == 0]
    offered: list[int] = []
    refused: dict[str, list[int]] = {}
    for tp in candidates:
        if heads and heads % tp:
            refused.setdefault(f"do not divide the {heads} attention heads", []).append(tp)
        elif kv and kv % tp:
            refused.setdefault(f"do not divide the {kv} key-value heads", []).append(tp)
        elif bad := next((n for n, size in sizes.items() if size % tp), None):
            refused.setdefault(f"do not divide {bad}'s split dimension ({sizes[bad]})", []).append(tp)
        else:
            offered.append(tp)
    reasons = [", ".join(f"tp={d}" for d in degrees) + f": {why}" for why, degrees in refused.items()]
    return offered, reasons


class _AllReduceGradient(torch.autograd.Function):
    """A colwise layer's replicated input: backward all-reduces its gradient into a new tensor."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.clone()


class _AllReduce(torch.autograd.Function):
    """A partial output made whole: the collective's output is a new full-size tensor."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _AllGather(torch.autograd.Function):
    """A column-split output gathered whole; backward keeps the rank's slice, made contiguous."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: int) -> torch.Tensor:
        ctx.width = x.shape[-1]
        return torch.cat([x] * tp, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.narrow(-1, 0, ctx.width).contiguous(), None


class _RankLinear(torch.nn.Linear):
    """One rank's share of a colwise or rowwise Linear; ``in_features`` and ``out_features`` are
    what the module takes and returns (full width after a gather), the weight is the shard."""

    def __init__(self, weight_shape: tuple[int, int], bias: int | None, kind: str, tp: int, dtype: Any) -> None:
        out_features, in_features = weight_shape
        super().__init__(in_features, out_features, bias=bias is not None, device="meta", dtype=dtype)
        if bias is not None and bias != out_features:  # never: a rowwise bias is whole, as is its output
            raise ValueError(f"bias of {bias} for {out_features} outputs")
        self.kind, self.tp = kind, tp
        if kind == "gather":
            self.out_features = out_features * tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "rowwise":
            y = _AllReduce.apply(F.linear(x, self.weight))
            return y if self.bias is None else y + self.bias
        y = F.linear(_AllReduceGradient.apply(x), self.weight, self.bias)
        return _AllGather.apply(y, self.tp) if self.kind == "gather" else y


class _RankEmbedding(torch.nn.Embedding):
    """One rank's rows of a vocab-parallel embedding: ids outside them are masked to zero rows,
    then the partial output is all-reduced."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < 0) | (ids >= self.num_embeddings)
        y = F.embedding(ids.masked_fill(outside, 0), self.weight)
        y.masked_fill_(outside.unsqueeze(-1), 0.0)
        return _AllReduce.apply(y)


def _rank_module(module: Any, kind: str, tp: int) -> Any:
    weight = module.weight
    if kind == "embedding":
        local: Any = _RankEmbedding(
            module.num_embeddings // tp, module.embedding_dim, device="meta", dtype=weight.dtype
        )
    else:
        out_features, in_features = weight.shape
        shape = (out_features, in_features // tp) if kind == "rowwise" else (out_features // tp, in_features)
        bias = getattr(module, "bias", None)
        local = _RankLinear(shape, None if bias is None else shape[0], kind, tp, weight.dtype)
    for name, param in local.named_parameters():
        param.requires_grad_(getattr(module, name).requires_grad)
    return local


def tp_local(skeleton: Any, tp: int) -> Any:
    """A copy of ``skeleton`` (a ``model.skeleton.Skeleton``) whose model is one rank's of ``tp``.

    ``tp`` must be one of ``tp_degrees``. Tied weights stay tied (an embedding and a head split
    alike share their shard); attention modules' head counts are divided where they keep them.
    """
    model = copy.deepcopy(skeleton.model)
    config = getattr(model, "config", None) or skeleton.config
    named = dict(model.named_modules())
    shards: dict[int, torch.nn.Parameter] = {}
    divided: set[int] = set()
    for name, style in _modules(model, tp_plan(model)).items():
        kind = STYLES[style]
        old: Any = named[name]
        new = _rank_module(old, kind, tp)
        tied = shards.get(id(old.weight))
        if tied is not None and tied.shape == new.weight.shape:
            new.weight = tied
        shards.setdefault(id(old.weight), new.weight)
        parent, _, leaf = name.rpartition(".")
        named[parent]._modules[leaf] = new
        if kind in ("colwise", "gather") and id(named[parent]) not in divided:
            owner = named[parent]
            divided.add(id(owner))
            for attr in _HEAD_ATTRIBUTES:
                value = getattr(owner, attr, None)
                if isinstance(value, int) and not isinstance(value, bool) and value % tp == 0:
                    setattr(owner, attr, value // tp)
    return dataclasses.replace(skeleton, model=model, config=config)
