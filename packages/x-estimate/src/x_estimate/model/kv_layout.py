"""The KV cache as transformers itself builds it: measured, not derived from config fields.

The model (already on the meta device) runs a prefill of 1, 2 and ``W + 2`` tokens with
``use_cache=True``, where ``W`` is the largest window or chunk length its config names. Every
tensor in the returned cache is read by where it sits (``layers.3.keys``), so each one's size
at any length follows from three points: ``per_token * min(S, cap) + fixed``. Multi-query,
grouped-query, MLA (transformers caches the decompressed keys and values), sliding windows
(transformers keeps ``window - 1`` positions), chunked attention and the constant states of
hybrid linear-attention or Mamba layers all come out of the same measurement. Meta tensors hold
no memory, so a 671B model's prefill of 128k tokens costs only Python time.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["KvLayout", "measure_kv_layout"]

# Above this many tokens the measuring prefill is not run: a window this long is not a window.
_MAX_PROBE = 1 << 20


@dataclass(frozen=True)
class KvLayout:
    """Cache size as a function of tokens, per sequence, floating-point values counted.

    ``groups`` holds ``(values_per_token, cap, fixed_values)``: ``cap`` None grows without bound.
    ``fixed_bytes`` are non-float tensors (position counters) counted at their own dtype.
    """

    groups: tuple[tuple[int, int | None, int], ...]
    fixed_bytes: int = 0

    def values(self, seq_len: int) -> int:
        """Floating-point values cached for one sequence of ``seq_len`` tokens."""
        return sum(per * (seq_len if cap is None else min(seq_len, cap)) + fixed for per, cap, fixed in self.groups)


def _tensors(obj: Any, path: str, out: dict[str, Any], seen: set[int], depth: int = 0) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            out[path] = obj
        return
    if depth > 6 or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return
    seen.add(id(obj))
    items: Iterable[tuple[Any, Any]]
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        items = vars(obj).items()
    else:
        return
    for key, value in items:
        _tensors(value, f"{path}.{key}" if path else str(key), out, seen, depth + 1)


def _probe_length(config: Any) -> int:
    """Two past the longest window or chunk any (sub)config names; 3 when there is none."""
    longest = 1
    todo = [config]
    while todo:
        cfg = todo.pop()
        items = cfg.to_dict().items() if hasattr(cfg, "to_dict") else cfg.items()
        for key, value in items:
            if isinstance(value, dict):
                todo.append(value)
            elif any(word in str(key) for word in ("window", "chunk")):
                values = value if isinstance(value, (list, tuple)) else [value]
                for v in values:
                    if isinstance(v, int) and not isinstance(v, bool):
                        longest = max(longest, v)
    return longest + 2


def _prefill(model: Any, seq_len: int) -> dict[str, tuple[int, bool, int]]:
    """{tensor path: (numel, is_float, bytes)} of the cache after a meta prefill of ``seq_len`` tokens."""
    import torch

    ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        out = model(input_ids=ids, use_cache=True)
        # transformers 5.24 names it ``cache`` and warns on the old name (on stderr, hence in here).
        cache = getattr(out, "cache", None)
        if cache is None:
            cache = getattr(out, "past_key_values", None)
    if cache is None and isinstance(out, (tuple, list)) and len(out) > 1:
        cache = out[1]
    if cache is None:
        raise ValueError("the forward returned no cache")
    found: dict[str, Any] = {}
    _tensors(cache, "", found, set())
    return {p: (t.numel(), t.is_floating_point(), t.numel() * t.element_size()) for p, t in found.items()}


@contextlib.contextmanager
def _switched(config: Any, attribute: str, value: str, *, unless: tuple[Any, ...] = ()) -> Iterator[None]:
    """Set a config's implementation choice for the prefill, and put it back after: what runs
    next (the training simulation) must see the config as it was."""
    before = getattr(config, attribute, None)
    switched = False
    if before not in unless and before != value:
        with contextlib.suppress(Exception):
            setattr(config, attribute, value)
            switched = True
    try:
        yield
    finally:
        if switched:
            with contextlib.suppress(Exception):
                setattr(config, attribute, before)


def _measure(model: Any, config: Any, probe: int) -> tuple[dict[str, Any], ...]:
    # grouped_mm (transformers' default for MoE) refuses float32 and meta; batched_mm only
    # gathers, which meta tensors can do. The cache does not depend on how experts compute.
    with _switched(config, "_experts_implementation", "batched_mm", unless=(None, "eager")):
        try:
            return _prefills(model, probe)
        except Exception:
            # SDPA's mask may read a padding mask's values (.item(), impossible on meta);
            # eager attention builds the mask without looking. The cache is the same.
            with _switched(config, "_attn_implementation", "eager"):
                return _prefills(model, probe)


def _prefills(model: Any, probe: int) -> tuple[dict[str, Any], ...]:
    one, two = _prefill(model, 1), _prefill(model, 2)
    # No window named: nothing to cap, and the third prefill is not worth its time.
    return one, two, (_prefill(model, probe) if probe > 3 else {})


def measure_kv_layout(model: Any, config: Any) -> KvLayout | None:
    """The cache a real prefill builds, as a ``KvLayout``; None when the model cannot run one.

    Examples:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ...                   num_key_value_heads=2, intermediate_size=128, vocab_size=100)
        >>> with torch.device("meta"):
        ...     model = LlamaForCausalLM(cfg)
        >>> measure_kv_layout(model, cfg).values(10)  # K and V, 2 kv heads x 16, 2 layers, 10 tokens
        1280
    """
    probe = _probe_length(config)
    if probe > _MAX_PROBE:
        return None
    try:
        one, two, far = _measure(model, config, probe)
    except Exception:  # any failure means no measurement, and the config formula answers
        return None
    groups: dict[int | None, list[int]] = {}
    fixed_bytes = 0
    for path, (n1, is_float, nbytes) in one.items():
        n2, _, _ = two.get(path, (n1, is_float, nbytes))
        nf, _, _ = far.get(path, (n1 + (probe - 1) * (n2 - n1), is_float, nbytes))
        if not is_float:
            fixed_bytes += nbytes
            continue
        per = n2 - n1
        fixed = n1 - per
        cap: int | None = None
        if per > 0 and nf < fixed + per * probe:
            cap, rest = divmod(nf - fixed, per)
            if rest:
                return None  # not linear in the tokens: nothing this layout can describe
        entry = groups.setdefault(cap, [0, 0])
        entry[0] += per
        entry[1] += fixed
    if not groups:
        return None
    ordered = sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    return KvLayout(tuple((per, cap, fixed) for cap, (per, fixed) in ordered), fixed_bytes)
