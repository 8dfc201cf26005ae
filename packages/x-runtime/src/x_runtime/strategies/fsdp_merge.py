"""Accelerate's FSDP checkpoint functions: ``save_fsdp_model``, ``load_fsdp_model``, ``save_fsdp_optimizer``,
``load_fsdp_optimizer``, ``merge_fsdp_weights``.

The files are Accelerate's: ``SHARDED_STATE_DICT`` writes ``<output_dir>/pytorch_model_fsdp_<i>/``
through ``torch.distributed.checkpoint`` (every rank its own shards, under the key ``model``);
``FULL_STATE_DICT`` gathers whole tensors and rank 0 writes ``pytorch_model_fsdp.bin``
(``pytorch_model_fsdp_<i>.bin`` past the first model). ``merge_fsdp_weights`` turns a sharded
folder into one ``model.safetensors`` (or ``pytorch_model.bin``) on one process, with no process
group needed: what ``x-launch merge-weights`` runs. The model may be FSDP2 (``fully_shard``),
DDP or plain: torch's ``get_model_state_dict`` reads each of them. The optimizer's files follow the
same two layouts (``optimizer.bin`` from rank 0, or ``optimizer_<i>/`` through DCP under the key
``optimizer``; with ``use_dcp=False`` one ``optimizer_<i>_rank<r>.bin`` per rank), as Accelerate
writes them, so transformers' ``Trainer`` checkpoints of FSDP runs resume on either side.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from x_runtime.core.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from x_runtime.core.unwrap import is_peft_model
from x_runtime.io.files import torch_load
from x_runtime.io.model_files import save_object
from x_runtime.process.topology.state import ProcessState

__all__ = [
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]


logger = logging.getLogger(__name__)


def _layout(fsdp_plugin: Any) -> str:
    """ "FULL_STATE_DICT" or "SHARDED_STATE_DICT", from a string or torch's ``StateDictType``."""
    kind = getattr(fsdp_plugin, "state_dict_type", None) or "FULL_STATE_DICT"
    name = str(getattr(kind, "name", kind)).upper().rsplit(".", 1)[-1]
    if name not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        raise ValueError(f"state_dict_type {name} is not supported with FSDP2: use FULL_ or SHARDED_STATE_DICT")
    return name


def _options(full: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=full)


def _adapter_keys(model: torch.nn.Module, state: dict[str, Any], adapter_only: bool) -> dict[str, Any]:
    """With ``adapter_only`` and a PEFT model, only its adapter's weights (``lora_*``, ``modules_to_save``).

    transformers' Trainer passes ``adapter_only=True`` for every model; a model without adapters
    keeps all its weights, as in Accelerate.
    """
    if not adapter_only or not is_peft_model(model):
        return state
    return {k: v for k, v in state.items() if "lora_" in k or "modules_to_save" in k}


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
) -> None:
    """Save ``model``'s weights into ``output_dir`` in the plugin's layout (see the module doc).

    Every rank must call it (the sharded layout writes from every rank, the full one gathers).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    full = _layout(fsdp_plugin) == "FULL_STATE_DICT"
    state = _adapter_keys(model, get_model_state_dict(model, options=_options(full)), adapter_only)
    if full:
        name = f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"
        if accelerator.process_index == 0:
            save_object(state, output / name)
        accelerator.wait_for_everyone()
        return
    import torch.distributed.checkpoint as dcp

    folder = output / f"{FSDP_MODEL_NAME}_{model_index}"
    folder.mkdir(parents=True, exist_ok=True)
    logger.info("saving model shards to %s", folder)
    dcp.save({"model": state}, checkpoint_id=str(folder))


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
) -> Any:
    """Load what ``save_fsdp_model`` wrote into ``model`` (any number of processes for sharded files)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    accelerator.wait_for_everyone()
    folder = Path(input_dir)
    strict = not adapter_only
    if _layout(fsdp_plugin) == "FULL_STATE_DICT":
        name = f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"
        distributed = accelerator.num_processes > 1
        state = torch_load(folder / name) if accelerator.process_index == 0 or not distributed else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed, strict=strict)
        return set_model_state_dict(model, state, options=options)
    import torch.distributed.checkpoint as dcp

    name = f"{FSDP_MODEL_NAME}_{model_index}"
    source = folder if name in folder.name else folder / name
    held = {"model": _adapter_keys(model, get_model_state_dict(model), adapter_only)}
    dcp.load(held, checkpoint_id=str(source))
    return set_model_state_dict(model, held["model"], options=StateDictOptions(strict=strict))


def _optimizer_file(index: int, rank: int | None = None) -> str:
    base = OPTIMIZER_NAME if index == 0 and rank is None else f"{OPTIMIZER_NAME}_{index}"
    return f"{base}_rank{rank}.bin" if rank is not None else f"{base}.bin"


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Save ``optimizer``'s state (of ``model``'s parameters) into ``output_dir`` in the plugin's layout.

    Every rank must call it. ``use_dcp=False`` (sharded layout only) writes one file per rank with
    no collective, to be read back by the same number of ranks.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    full = _layout(fsdp_plugin) == "FULL_STATE_DICT"
    state = get_optimizer_state_dict(model, getattr(optimizer, "optimizer", optimizer), options=_options(full))
    if full:
        if accelerator.process_index == 0:
            save_object(state, output / _optimizer_file(optimizer_index))
        accelerator.wait_for_everyone()
    elif not use_dcp:
        save_object(state, output / _optimizer_file(optimizer_index, accelerator.process_index))
    else:
        import torch.distributed.checkpoint as dcp

        dcp.save({"optimizer": state}, checkpoint_id=str(output / f"{OPTIMIZER_NAME}_{optimizer_index}"))


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load what ``save_fsdp_optimizer`` wrote into ``optimizer`` (sharded files on any number of ranks)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    accelerator.wait_for_everyone()
    inner = getattr(optimizer, "optimizer", optimizer)
    folder = Path(input_dir)
    if _layout(fsdp_plugin) == "FULL_STATE_DICT":
        distributed = accelerator.num_processes > 1
        first = accelerator.process_index == 0 or not distributed
        state = torch_load(folder / _optimizer_file(optimizer_index)) if first else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
        set_optimizer_state_dict(model, inner, state, options=options)
        return
    if not use_dcp:
        state = torch_load(folder / _optimizer_file(optimizer_index, accelerator.process_index))
    else:
        import torch.distributed.checkpoint as dcp

        name = f"{OPTIMIZER_NAME}_{optimizer_index}"
        held = {"optimizer": get_optimizer_state_dict(model, inner)}
        dcp.load(held, checkpoint_id=str(folder if folder.name == name else folder / name))
        state = held["optimizer"]
    set_optimizer_state_dict(model, inner, state)


def merge_fsdp_weights(
    checkpoint_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path | None:
    """Merge a sharded checkpoint folder into ``output_path/model.safetensors`` (or ``pytorch_model.bin``).

    Runs on the main process (the others wait when a process group exists); works with no
    process group at all, on CPU. Returns the merged file's path (None off the main process).

    Raises:
        ValueError: ``checkpoint_dir`` does not exist (pointing at a model or optimizer folder
            inside it when there is one).
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    source = Path(checkpoint_dir)
    if not source.exists():
        hint = ""
        for inner in (f"{FSDP_MODEL_NAME}_0", "optimizer_0"):
            if (source / inner).exists():
                hint = f"; pass {source / inner} instead"
        raise ValueError(f"{source} holds no sharded checkpoint (no such folder){hint}")
    if not (source / ".metadata").exists():
        model_folder = source / f"{FSDP_MODEL_NAME}_0"
        hint = f"; pass {model_folder} instead" if (model_folder / ".metadata").exists() else ""
        raise ValueError(f"{source} is not a torch.distributed.checkpoint folder (no .metadata){hint}")
    here = ProcessState.from_environment(cpu=True)
    target: Path | None = None
    if here.is_main_process:
        out = Path(output_path)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out) as scratch:
            flat = Path(scratch) / "merged.pt"
            dcp_to_torch_save(str(source), str(flat))
            state = torch_load(flat)
        if len(state) == 1 and isinstance(next(iter(state.values())), dict):
            state = next(iter(state.values()))  # {"model": {...}} as save_fsdp_model writes it
        target = out / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
        save_object(state, target, safe_serialization=safe_serialization)
        logger.info("merged %s into %s", source, target)
        if remove_checkpoint_dir:
            shutil.rmtree(source)
    here.wait_for_everyone()
    return target
