"""What a config.json must satisfy before x-estimate builds its model, and how a failed build
is explained.

Only what transformers never accepts is refused up front: a size that is text, a boolean, a
fraction or negative, and more layers than any model has (200,000 layers take an hour to build
on meta). Zero, list and dict sizes are legal in some configs (Swin's ``depths``, a zero
``num_key_value_heads`` placeholder...), so they go to transformers; when its build then fails,
the message names the suspicious size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeGuard

from x_estimate.model.errors import EstimateError

__all__ = ["MAX_LAYERS", "check_config", "suspicious_sizes"]

# Published models have under 200 layers; transformers builds about 50 layers a second on meta
# (a loaded machine: 20), so this bound keeps the worst accepted config under a minute.
MAX_LAYERS = 1024

_SIZE_KEYS = (
    "hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "intermediate_size",
    "vocab_size", "head_dim", "n_embd", "n_head", "n_layer", "d_model", "num_heads", "num_layers",
)  # fmt: skip


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _nested(config: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        name = f"{prefix}{key}"
        yield name, value
        if isinstance(value, dict) and depth < 3:
            yield from _nested(value, f"{name}.", depth + 1)


def _is_layer_count(key: str) -> bool:
    last = key.rpartition(".")[2]
    return last.endswith("layers") or last in ("n_layer", "num_layer")


def check_config(name: str, config: dict[str, Any] | None) -> None:
    """Refuse what no transformers model accepts, naming the key.

    Raises:
        EstimateError: a size is not a whole number of at least 0, or a layer count is above ``MAX_LAYERS``.
    """
    config = config or {}
    for key in _SIZE_KEYS:
        value = config.get(key)
        values = value if isinstance(value, (list, tuple)) else [value]
        # Negative counts are no placeholder in any transformers config; a zero one can be.
        if any(v is not None and not isinstance(v, dict) and not (_is_int(v) and v >= 0) for v in values):
            raise EstimateError(f"{name}: config.json sets {key} to {value!r}; it must be a positive integer")
    for key, value in _nested(config):
        if _is_layer_count(key) and _is_int(value) and value > MAX_LAYERS:
            raise EstimateError(
                f"{name}: config.json sets {key} to {value:,}; x-estimate builds at most {MAX_LAYERS:,} layers "
                "(published models have under 200): check the config"
            )


def suspicious_sizes(config: dict[str, Any] | None) -> str:
    """``" (config.json sets hidden_size to 0)"`` for sizes below 1, to explain a failed build; "" if none."""
    found = [f"{key} to {value!r}" for key in _SIZE_KEYS if _is_int(value := (config or {}).get(key)) and value < 1]
    return f" (config.json sets {', '.join(found)})" if found else ""
