"""The user's model inside what prepare (or the user) wrapped it in: ``torch.compile``, DDP,
``DataParallel``, a DeepSpeed engine; and whether a model is PEFT's wrapper."""

from __future__ import annotations

import sys
from typing import Any

from torch.nn.parallel import DataParallel, DistributedDataParallel

__all__ = ["is_peft_model", "unwrap_model"]


def unwrap_model(model: Any, *, keep_torch_compile: bool = False, through_ddp: bool = True) -> Any:
    """``model`` without the wrappers a strategy (and compilation) put around it.

    Args:
        model: a prepared model.
        keep_torch_compile: return the compiled wrapper when the model was compiled whole.
        through_ddp: unwrap DDP and ``DataParallel`` too (``no_sync`` needs the DDP wrapper itself).

    Examples:
        >>> import torch
        >>> inner = torch.nn.Linear(1, 1)
        >>> unwrap_model(inner) is inner
        True
    """
    compiled = model if hasattr(model, "_orig_mod") else None
    if compiled is not None:
        model = compiled._orig_mod
    if type(model).__name__ == "DeepSpeedEngine":
        return model.module
    if isinstance(model, (DistributedDataParallel, DataParallel)):
        if not through_ddp:
            return model
        # A compiled DDP (DataParallel) wrapper cannot be kept without the wrapper inside it: return the model.
        return unwrap_model(model.module, keep_torch_compile=keep_torch_compile)
    return compiled if keep_torch_compile and compiled is not None else model


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a PEFT model (``peft.PeftModel``); ``False`` when PEFT is not installed.

    Examples:
        >>> import torch
        >>> is_peft_model(torch.nn.Linear(1, 1))
        False
    """
    # A PEFT model exists only once peft is imported: nothing to import (or depend on) here.
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)
