"""Model and optimizer state in parts, through ``torch.distributed.checkpoint`` (DCP), readable at any layout.

DCP writes each tensor under its name with its global shape, every rank the part it holds, and
reads back whatever part the reader holds: a folder written by FSDP over 4 ranks, by FSDP x TP on
a 2 x 2 mesh or by tensor parallelism alone loads into any of them, into DDP, or into one process
(where DCP needs no process group). torch's ``get_model_state_dict`` names tensors the same way
whether the model is plain, DDP-wrapped, split by a TP plan or sharded by ``fully_shard``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["load_sharded_model", "load_sharded_optimizer", "save_sharded_model", "save_sharded_optimizer"]


def save_sharded_model(folder: Path, model: torch.nn.Module) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(folder))


def load_sharded_model(folder: Path, model: torch.nn.Module, *, strict: bool) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    held = {"model": get_model_state_dict(model)}
    dcp.load(held, checkpoint_id=str(folder))
    set_model_state_dict(model, held["model"], options=StateDictOptions(strict=strict))


def save_sharded_optimizer(folder: Path, optimizer: Any, model: torch.nn.Module) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, _inner(optimizer))}, checkpoint_id=str(folder))


def load_sharded_optimizer(folder: Path, optimizer: Any, model: torch.nn.Module) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    inner = _inner(optimizer)
    held = {"optimizer": get_optimizer_state_dict(model, inner)}
    dcp.load(held, checkpoint_id=str(folder))
    set_optimizer_state_dict(model, inner, held["optimizer"])


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)
