"""Memory that depends on the inputs: the KV cache of decoder models and training activations.

KV cache (decoder-only models), bytes = sum over layers of
``2 * kv_heads * head_dim * min(S, window_layer) * B * bytes_per_value``: keys and values per
layer, grouped-query attention through ``num_key_value_heads``, an explicit ``head_dim`` where
the config has one, and sliding-window layers holding at most ``sliding_window`` positions.

Activations of one training step, per transformer layer (Korthikanti et al., 2022, "Reducing
Activation Recomputation in Large Transformer Models", no tensor or sequence parallelism,
16-bit activations; doubled for fp32 training): ``s*b*h*(34 + 5*a*s/h)`` bytes without recomputation, and ``2*s*b*h``
bytes (each layer's input) with full activation checkpointing. The ``5*a*s/h`` term is the
attention score matrix; fused attention kernels (FlashAttention, SDPA) do not keep it, so the
figure without checkpointing is an upper bound for them. Embeddings and the loss's logits are
not included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def attention_shape(config: Any) -> AttentionShape | None:
    """Attention geometry from a transformers config, or None when the config does not say."""
    if config is None:
        return None
    cfg = _text_config(config)
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        return None
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == layers:
        windows = tuple(window if t == "sliding_attention" and window else None for t in layer_types)
    elif window and getattr(cfg, "use_sliding_window", True):
        windows = (window,) * layers
    else:
        windows = (None,) * layers
    return AttentionShape(layers, hidden, heads, kv_heads, head_dim, windows)


def kv_cache_bytes(shape: AttentionShape, *, seq_len: int, batch_size: int, bytes_per_value: float) -> int:
    """Bytes of keys and values cached for ``batch_size`` sequences of ``seq_len`` tokens.

    Examples:
        >>> s = AttentionShape(32, 4096, 32, 8, 128, (None,) * 32)  # Llama-3-8B
        >>> kv_cache_bytes(s, seq_len=8192, batch_size=1, bytes_per_value=2) / 2**30
        1.0
    """
    positions = sum(seq_len if w is None else min(seq_len, w) for w in shape.windows)
    return int(2 * shape.kv_heads * shape.head_dim * positions * batch_size * bytes_per_value)


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
