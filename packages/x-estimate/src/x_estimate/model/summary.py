"""A built model reduced to plain data: its tensors, module classes and attention shape.

Everything the report computes reads this summary, not the ``nn.Module``; so the summary can be
cached on disk, and a second estimate of the same config needs neither torch nor transformers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from x_common.module_sizes import TensorInfo
from x_estimate.model.inference import AttentionShape

__all__ = ["SUMMARY_FORMAT", "ModelSummary", "summarize"]

SUMMARY_FORMAT = 3  # bump when the fields change: old cache entries are then ignored


@dataclass
class ModelSummary:
    library: str
    class_name: str
    note: str
    tensors: list[TensorInfo]
    modules: dict[str, str]  # qualified module name -> class name, in module order; "" is the root
    no_split: list[str] = field(default_factory=list)
    linear: dict[str, tuple[int, int]] = field(default_factory=dict)  # quantizable weight -> (out, in)
    attention: AttentionShape | None = None
    can_generate: bool = False
    # Whether the KV cache layout was measured (a meta prefill, ~0.3-3 s): done only when a run asks
    # for --seq-len, so a first estimate without it costs the build alone.
    kv_measured: bool = False

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors if t.is_parameter and t.requires_grad)

    def to_json(self) -> str:
        data = asdict(self)
        data["format"] = SUMMARY_FORMAT
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> ModelSummary:
        data = json.loads(text)
        if not isinstance(data, dict) or data.pop("format", None) != SUMMARY_FORMAT:
            raise ValueError("summary written by another version")
        data["tensors"] = [
            TensorInfo(tuple(t["names"]), tuple(t["shape"]), t["dtype"], t["is_parameter"], t["requires_grad"])
            for t in data["tensors"]
        ]
        data["linear"] = {k: (int(v[0]), int(v[1])) for k, v in data["linear"].items()}
        att = data["attention"]
        if att is not None:
            data["attention"] = AttentionShape(**{**att, "windows": tuple(att["windows"])})
        return cls(**data)


def _head(model: Any) -> Any:
    import torch

    for getter in ("get_output_embeddings", "get_classifier"):
        fn = getattr(model, getter, None)
        if callable(fn):
            try:
                head = fn()
            except (NotImplementedError, AttributeError):
                continue
            if isinstance(head, torch.nn.Module):
                return head
    return None


def _linear_weights(model: Any) -> dict[str, tuple[int, int]]:
    """{weight name: (out, in)} of the linear weights a quantizing loader converts (not the head)."""
    import torch

    head = _head(model)
    found: dict[str, tuple[int, int]] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if module is head or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        if isinstance(module, torch.nn.Linear):
            out, inp = weight.shape
        elif type(module).__name__ == "Conv1D":  # GPT-2's transposed linear
            inp, out = weight.shape
        else:
            continue
        found[f"{name}.weight" if name else "weight"] = (int(out), int(inp))
    return found


def summarize(skeleton: Any, *, measure_kv: bool = True) -> ModelSummary:
    """Reduce a built ``Skeleton`` to a ``ModelSummary``; ``measure_kv``: size the KV cache from a meta prefill."""
    from x_common.module_sizes import tensor_infos
    from x_estimate.model.inference import attention_shape

    model = skeleton.model
    config = skeleton.config
    can_generate = bool(getattr(model, "can_generate", lambda: False)()) and not getattr(
        config, "is_encoder_decoder", False
    )
    return ModelSummary(
        library=skeleton.library,
        class_name=skeleton.class_name,
        note=skeleton.note,
        tensors=tensor_infos(model),
        modules={name: type(module).__name__ for name, module in model.named_modules()},
        no_split=sorted(skeleton.no_split),
        linear=_linear_weights(model),
        # Encoder-decoder attention (self + cross, two stacks) is not what these formulas describe.
        attention=None
        if getattr(config, "is_encoder_decoder", False)
        else attention_shape(config, model if measure_kv else None),
        can_generate=can_generate,
        kv_measured=measure_kv,
    )
