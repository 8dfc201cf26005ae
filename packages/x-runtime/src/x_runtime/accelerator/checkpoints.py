"""The ``Accelerator``'s methods that write and read files: checkpoints, weights, objects.

A mixin of the facade: ``save_state``/``load_state`` go through ``checkpointing`` (the strategy
writes the model and optimizer files), ``save_model`` through ``model_files``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from x_runtime.accelerator.fields import AcceleratorFields
from x_runtime.checkpoint.background import PendingSave, start_save, wait_save
from x_runtime.checkpoint.checkpointing import CheckpointParts, load_checkpoint, save_checkpoint
from x_runtime.checkpoint.naming import load_source, note_loaded, note_saved, prune_saved, save_target
from x_runtime.checkpoint.snapshot import HostBuffers, copies_in_background
from x_runtime.core.unwrap import unwrap_model
from x_runtime.io.model_files import save_object, save_state_dict_files

__all__ = ["CheckpointMethods"]

logger = logging.getLogger(__name__)


class CheckpointMethods(AcceleratorFields):
    """Accelerate's saving and loading methods, over what the accelerator prepared."""

    _pending_save: PendingSave | None = None  # save_state(async_save=True) still writing
    _host_buffers: HostBuffers | None = None  # its copy's memory, kept for the next one

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Also save and restore these objects (each needs ``state_dict``/``load_state_dict``).

        Raises:
            ValueError: (as Accelerate) objects without them; the message names their types.
        """
        invalid = [
            f"Item at index {i} ({type(o).__name__})"
            for i, o in enumerate(objects)
            if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))
        ]
        if invalid:
            raise ValueError(
                f"register_for_checkpointing: every object needs state_dict and load_state_dict; {', '.join(invalid)} "
                f"lack{'s' if len(invalid) == 1 else ''} them"
            )
        self._prepared.custom.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in every ``save_state``, before any file is written.

        ``models`` are the prepared models, ``weights`` their state dicts (unwrapped names), and
        ``output_dir`` the folder being written (it becomes the checkpoint, complete, once the save
        succeeds: files the hook writes there are part of it). A model whose state dict the hook
        removes from ``weights`` gets no weights file (the hook saved it its own way). Every
        process calls it. ``handle.remove()`` unregisters it.
        """
        handle = RemovableHandle(self._save_state_hooks)
        self._save_state_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in every ``load_state``, before anything is loaded.

        A model the hook removes from ``models`` is not loaded from the weights files (the hook
        loaded it its own way). Every process calls it. ``handle.remove()`` unregisters it.
        """
        handle = RemovableHandle(self._load_state_hooks)
        self._load_state_hooks[handle.id] = hook
        return handle

    def _parts(self) -> CheckpointParts:
        return CheckpointParts(
            models=[unwrap_model(m) for m in self._prepared.models],
            optimizers=list(self._prepared.optimizers),
            schedulers=list(self._prepared.schedulers),
            dataloaders=list(self._prepared.dataloaders),
            custom=list(self._prepared.custom),
            scaler=self.precision.scaler,
            strategy=self.strategy,
        )

    def _save_hooks_step(self) -> Callable[[Path], list[torch.nn.Module]] | None:
        if not self._save_state_hooks:
            return None
        models = list(self._prepared.models)
        # Gathered here, on every rank (sharded weights take a collective), not in the agreed write step.
        weights = [self.get_state_dict(model) for model in models]
        given = list(zip(models, weights, strict=True))

        def run(folder: Path) -> list[torch.nn.Module]:
            for hook in list(self._save_state_hooks.values()):
                hook(models, weights, str(folder))
            return [unwrap_model(m) for m, w in given if any(w is kept for kept in weights)]

        return run

    def _load_hooks_step(self) -> Callable[[Path], list[torch.nn.Module]] | None:
        if not self._load_state_hooks:
            return None

        def run(folder: Path) -> list[torch.nn.Module]:
            models = list(self._prepared.models)
            for hook in list(self._load_state_hooks.values()):
                hook(models, str(folder))
            return [unwrap_model(m) for m in models]

        return run

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        async_save: bool = False,
    ) -> str:
        """Save models, optimizers, schedulers, scaler, RNG states, loader positions, registered objects.

        Every process must call it. The folder appears complete or not at all.
        ``safe_serialization=False`` writes whole-model weights as ``pytorch_model.bin`` (as
        Accelerate does; plain tensors, read back without running pickled code) instead of
        ``model.safetensors``; ``load_state`` reads either.

        ``async_save=True`` (x only; Accelerate has no asynchronous save) returns once the state is
        copied to host memory; a background thread per process writes the copy, with the same
        guarantees. The folder appears when the write ends; ``total_limit`` prunes after that.
        The next ``save_state``, ``load_state``, ``wait_for_checkpoint`` or ``end_training`` waits
        for it and raises, on every process, an error it met. Sharded strategies (FSDP,
        DeepSpeed) and XLA save synchronously (their writers need collectives).

        Raises:
            DiskFullError: (an ``OSError``, errno ``ENOSPC``) on every process, when the weights and
                optimizer state cannot fit in the free space (nothing is written), or when the disk
                fills during the save (the partial folder is removed); it names the folder, the
                bytes needed and free. The previous checkpoint in ``output_dir`` stays loadable.
        """
        self.wait_for_checkpoint()
        config = self.project_configuration
        target = save_target(config, output_dir)
        parts = self._parts()
        parts.before_save = self._save_hooks_step()
        parts.step = self.step
        main = self.process_state.is_main_process
        if async_save and copies_in_background(self.strategy):
            prune = lambda: prune_saved(config, is_main_process=main)  # noqa: E731
            if self._host_buffers is None:
                self._host_buffers = HostBuffers()
            self._pending_save = start_save(
                target,
                parts,
                self.process_state,
                buffers=self._host_buffers,
                safe_serialization=safe_serialization,
                after=prune,
            )
            config.iteration += 1  # the next save's name; the folder itself appears later
            return str(target)
        if async_save:
            logger.warning("save_state(async_save=True): %s saves synchronously", type(self.strategy).__name__)
        save_checkpoint(target, parts, self.process_state, safe_serialization=safe_serialization)
        note_saved(config, is_main_process=main)
        self.process_state.wait_for_everyone()
        return str(target)

    def wait_for_checkpoint(self) -> str | None:
        """Wait for a ``save_state(async_save=True)`` still writing; return its folder (None: none).

        Every process must call it (as ``save_state``). An error the background write met on any
        process is raised here on every process, as the synchronous save would have raised it.
        """
        pending, self._pending_save = self._pending_save, None
        if pending is None:
            return None
        return str(wait_save(pending, self.process_state))

    def end_training(self) -> None:
        """Wait for a pending asynchronous save (``wait_for_checkpoint``), then end as before."""
        self.wait_for_checkpoint()
        self._host_buffers = None  # the copies' memory: no more saves
        super().end_training()  # type: ignore[misc]  # TrackingMethods', next in the facade's bases

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, strict: bool = True) -> str:
        """Restore what ``save_state`` saved (the latest automatic checkpoint when no folder given).

        Files are read without running pickled code: one holding other objects than tensors,
        numbers, strings and containers raises ``pickle.UnpicklingError`` naming it and the type.
        A folder written by Accelerate's ``save_state`` loads too (one process or DDP; its loaders'
        position is not in it: ``skip_first_batches`` as under Accelerate).
        """
        self.wait_for_checkpoint()  # it may be the very checkpoint asked for
        source = load_source(self.project_configuration, input_dir)
        parts = self._parts()
        parts.before_load = self._load_hooks_step()
        folder = load_checkpoint(source, parts, self.process_state, strict=strict)
        if parts.step is not None:  # Accelerate's checkpoints record it (accumulation continues in phase)
            self.step = parts.step
        note_loaded(self.project_configuration, folder)
        return str(folder)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The whole model's weights; sharded models are gathered to the main process (every rank calls)."""
        return self.strategy.state_dict(unwrap_model(model) if unwrap else model)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Weights as ``model.safetensors``, or shards plus ``model.safetensors.index.json``.

        ``safe_serialization=False`` writes ``pytorch_model.bin`` (or its shards and index), as
        Accelerate does: plain tensors only, which ``torch.load(weights_only=True)`` reads.
        """
        if Path(save_directory).is_file():
            raise ValueError(f"save_model: {save_directory} is a file; give a directory")
        state_dict = self.get_state_dict(model)
        if self.process_state.is_main_process:
            save_state_dict_files(
                state_dict, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization
            )
        self.process_state.wait_for_everyone()

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """``torch.save`` (or safetensors for a dict of tensors) on the main process only."""
        obj = self.strategy.to_host(obj)  # every process: on XLA this runs the graph that makes obj
        if self.process_state.is_main_process:
            save_object(obj, f, safe_serialization=safe_serialization)
