"""``get_model_tp_size``: the tensor parallel degree a transformers model was loaded with.

transformers records it in two places depending on its major version: before 5 on the model
(``model.tp_size``), from 5 in the config's ``distributed_config`` (an object, or a dict once the
config went through JSON), leaving ``model.tp_size`` as ``None``. Reading both keeps one answer
whichever transformers loaded the model.
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_model_tp_size"]


def get_model_tp_size(model: Any) -> int | None:
    """The model's tensor parallel size, or ``None`` when it was not sharded that way.

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> get_model_tp_size(model) is None
        True
        >>> model.tp_size = 2
        >>> get_model_tp_size(model)
        2
    """
    size: int | None = getattr(model, "tp_size", None)
    if size is not None:
        return size
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed, dict):
        return distributed.get("tp_size")
    return getattr(distributed, "tp_size", None)
