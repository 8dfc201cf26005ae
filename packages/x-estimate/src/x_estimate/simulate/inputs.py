"""The batch and the loss of one simulated training step, chosen from the model's class.

Task heads train on their own loss, fed labels the way the Trainer does: a language-model head
(``*ForCausalLM``, ``*LMHeadModel``, ``*ForMaskedLM``, ``*ForConditionalGeneration``) gets
``labels`` the shape of ``input_ids`` (encoder-decoder models then decode a sequence as long as
the input); classification heads get one label per sequence or image, token classification
one per token. A bare model (``BertModel``, ``--base-model``) has no loss: the step trains on
the mean of its first output, which has the same backward graph as any loss put on top, less
the head. Images come at the config's ``image_size`` (timm: the model's default input size),
which fixes their sequence length instead of ``--seq-len``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from x_estimate.simulate.error import SimulationError

__all__ = ["LM_SUFFIXES", "StepInputs", "step_inputs", "step_loss"]

LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration")
_PER_ITEM = ("ForSequenceClassification", "ForImageClassification", "ForMultipleChoice")


@dataclass
class StepInputs:
    make: Callable[[], dict[str, torch.Tensor]]  # a fresh batch, built inside the fake mode
    loss: Callable[[Any], torch.Tensor]
    notes: list[str] = field(default_factory=list)


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    return next(v for v in out if isinstance(v, torch.Tensor))


def step_loss(out: Any, labels: torch.Tensor | None = None) -> torch.Tensor:
    """The loss a step backpropagates: the model's own, else cross-entropy on ``labels``, else a mean."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    first = _first_tensor(out)
    if labels is not None:
        return torch.nn.functional.cross_entropy(first.float(), labels)
    return first.float().mean()


def _image_size(model: torch.nn.Module, config: Any) -> tuple[int, int, int]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if "input_size" in cfg:
        c, h, w = cfg["input_size"]
        return int(c), int(h), int(w)
    size = getattr(config, "image_size", 224)
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return int(getattr(config, "num_channels", 3)), int(h), int(w)


def step_inputs(model: torch.nn.Module, config: Any, *, batch_size: int, seq_len: int) -> StepInputs:
    """Batch and loss for ``model``'s class, ``batch_size`` x ``seq_len`` tokens (or images)."""
    name = type(model).__name__
    main = getattr(model, "main_input_name", "pixel_values" if config is None else "input_ids")
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    dtype = torch.float32 if weight is None else weight.dtype
    b, s = batch_size, seq_len
    notes: list[str] = []
    if main == "input_ids":
        vocab = int(getattr(config, "vocab_size", 2))

        def make() -> dict[str, torch.Tensor]:
            ids = torch.randint(0, vocab, (b, s))
            batch = {"input_ids": ids}
            if name.endswith(LM_SUFFIXES):
                batch["labels"] = torch.randint(0, vocab, (b, s))
            elif name.endswith(_PER_ITEM):
                batch["labels"] = torch.randint(0, max(getattr(config, "num_labels", 2), 1), (b,))
            elif name.endswith("ForTokenClassification"):
                batch["labels"] = torch.randint(0, max(getattr(config, "num_labels", 2), 1), (b, s))
            return batch

        return StepInputs(make, step_loss, notes)
    if main == "pixel_values":
        c, h, w = _image_size(model, config)
        notes.append(f"images {c}x{h}x{w} (the config's size; --seq-len does not apply)")
        classes = getattr(model, "num_classes", None) if config is None else getattr(config, "num_labels", None)
        with_labels = config is None or name.endswith(_PER_ITEM)

        def make_images() -> dict[str, torch.Tensor]:
            batch = {"pixel_values": torch.empty(b, c, h, w, dtype=dtype)}
            if with_labels and config is not None:
                batch["labels"] = torch.randint(0, max(classes or 2, 1), (b,))
            return batch

        if config is None:  # timm: the model returns logits, the loss is the caller's
            labels: list[torch.Tensor] = []

            def make_timm() -> dict[str, torch.Tensor]:
                labels[:] = [torch.randint(0, max(classes or 2, 1), (b,))]
                return {"x": torch.empty(b, c, h, w, dtype=dtype)}

            return StepInputs(make_timm, lambda out: step_loss(out, labels[0]), notes)
        return StepInputs(make_images, step_loss, notes)
    raise SimulationError(f"{name} takes {main!r} as input, which the simulation does not build")
