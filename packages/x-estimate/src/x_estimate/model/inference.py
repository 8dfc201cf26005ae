"""Memory that depends on the inputs: the KV cache of decoder models and training activations.

KV cache (decoder-only models): measured from the cache transformers itself builds in a meta
prefill (``kv_layout.py``) whenever the model is at hand and can run one; exact for multi-query,
grouped-query, MLA, sliding-window, chunked and hybrid layouts. Without a measurement, a formula
from the config: bytes = sum over layers of ``2 * kv_heads * head_dim * min(S, window - 1) * B *
bytes_per_value`` (transformers keeps ``window - 1`` positions of a sliding layer), with
``num_key_value_heads`` / ``num_kv_heads`` / ``multi_query`` for the heads, an explicit
``head_dim`` where the config has one, and ``kv_lora_rank + qk_rope_head_dim`` values per token
and layer for MLA (the latent transformers caches).

Activations of one training step, per transformer layer (Korthikanti et al., 2022, "Reducing
Activation Recomputation in Large Transformer Models", no tensor or sequence parallelism,
16-bit activations; doubled for fp32 training): ``s*b*h*(34 + 5*a*s/h)`` bytes without recomputation, and ``2*s*b*h``
bytes (each layer's input) with full activation checkpointing. The ``5*a*s/h`` term is the
attention score matrix; fused attention kernels (FlashAttention, SDPA) do not keep it, so the
figure without checkpointing is an upper bound for them. Embeddings and the loss's logits are
not included.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from x_estimate.model.kv_layout import KvLayout, measure_kv_layout

__all__ = ["AttentionShape", "activation_bytes", "attention_shape", "kv_cache_bytes"]


@dataclass(frozen=True)
class AttentionShape:
    """Attention geometry of a decoder stack: what the KV cache and activation formulas need."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    windows: tuple[int | None, ...]  # per layer: None for full attention
    kv: KvLayout | None = None  # the cache transformers builds, measured; None: the formula
    kv_per_layer: int | None = None  # values per token and layer where the formula is not 2*kv_heads*head_dim

    def __post_init__(self) -> None:
        # Read back from JSON, the layout is a dict of lists.
        kv = self.kv
        if isinstance(kv, dict):
            groups = tuple((int(p), None if c is None else int(c), int(f)) for p, c, f in kv["groups"])
            object.__setattr__(self, "kv", KvLayout(groups, int(kv.get("fixed_bytes", 0))))
        object.__setattr__(self, "windows", tuple(self.windows))


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    try:
        return getter() if callable(getter) else config
    except ValueError:  # several text configs (MusicGen's text encoder and decoder): none is *the* one
        return config


def _get(cfg: Any, name: str) -> Any:
    # Heterogeneous configs (per-layer attributes) raise on a global read of a per-layer
    # attribute: that attribute is then unknown, not the whole estimate lost.
    try:
        return getattr(cfg, name, None)
    except Exception:
        return None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _kv_heads(cfg: Any, heads: int) -> int:
    # Falcon and GPT-BigCode: one key/value head shared by all query heads (Falcon's config
    # still sets num_kv_heads to the query heads then; only its new architecture reads it).
    if _get(cfg, "multi_query") is True and not _get(cfg, "new_decoder_architecture"):
        return 1
    return _positive(_get(cfg, "num_key_value_heads")) or _positive(_get(cfg, "num_kv_heads")) or heads


def _mla_per_layer(cfg: Any) -> int | None:
    # Multi-head latent attention (DeepSeek-V2/V3): transformers caches the compressed latent.
    rank, rope = _positive(_get(cfg, "kv_lora_rank")), _positive(_get(cfg, "qk_rope_head_dim"))
    return rank + rope if rank and rope else None


def attention_shape(config: Any, model: Any = None) -> AttentionShape | None:
    """Attention geometry from a transformers config, or None when the config does not say.

    With ``model`` (built on meta from ``config``) able to generate, the KV cache is measured
    from a meta prefill (``kv_layout.measure_kv_layout``); otherwise the formula answers.
    """
    if config is None:
        return None
    cfg = _text_config(config)
    layers = _positive(_get(cfg, "num_hidden_layers"))
    heads = _positive(_get(cfg, "num_attention_heads"))
    hidden = _positive(_get(cfg, "hidden_size"))
    if not (layers and heads and hidden):
        return None
    kv_heads = _kv_heads(cfg, heads)
    head_dim = _positive(_get(cfg, "head_dim")) or hidden // heads
    window = _positive(_get(cfg, "sliding_window"))
    layer_types = _get(cfg, "layer_types")
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == layers:
        windows = tuple(window if t == "sliding_attention" and window else None for t in layer_types)
    elif window and _get(cfg, "use_sliding_window") is not False:
        windows = (window,) * layers
    else:
        windows = (None,) * layers
    kv = _measured(model, config)
    return AttentionShape(layers, hidden, heads, kv_heads, head_dim, windows, kv, _mla_per_layer(cfg))


def _measured(model: Any, config: Any) -> KvLayout | None:
    if model is None or _get(config, "is_encoder_decoder"):
        return None
    can_generate = False
    with contextlib.suppress(Exception):
        can_generate = bool(model.can_generate())
    return measure_kv_layout(model, config) if can_generate else None


def kv_cache_bytes(shape: AttentionShape, *, seq_len: int, batch_size: int, bytes_per_value: float) -> int:
    """Bytes of keys and values cached for ``batch_size`` sequences of ``seq_len`` tokens.

    Examples:
        >>> s = AttentionShape(32, 4096, 32, 8, 128, (None,) * 32)  # Llama-3-8B
        >>> kv_cache_bytes(s, seq_len=8192, batch_size=1, bytes_per_value=2) / 2**30
        1.0
    """
    if shape.kv is not None:
        return int(shape.kv.values(seq_len) * batch_size * bytes_per_value) + shape.kv.fixed_bytes
    positions = sum(seq_len if w is None else min(seq_len, max(w - 1, 1)) for w in shape.windows)
    per_layer = shape.kv_per_layer or 2 * shape.kv_heads * shape.head_dim
    return int(per_layer * positions * batch_size * bytes_per_value)


def activation_bytes(
    shape: AttentionShape, *, seq_len: int, batch_size: int, checkpointing: bool, bytes_per_value: int = 2
) -> int:
    """Activation bytes of one training step (Korthikanti et al., 2022), all layers.

    The paper's constants assume 16-bit activations; ``bytes_per_value=4`` (fp32 training)
    doubles them, a slight overestimate for the 1-byte dropout masks they include.

    Examples:
        >>> s = AttentionShape(1, 1024, 16, 16, 64, (None,))
        >>> activation_bytes(s, seq_len=2, batch_size=1, checkpointing=True)
        4096
    """
    s, b, h, a = seq_len, batch_size, shape.hidden, shape.heads
    per_layer = 2 * s * b * h if checkpointing else s * b * h * 34 + 5 * a * s * s * b
    return shape.layers * per_layer * bytes_per_value // 2
