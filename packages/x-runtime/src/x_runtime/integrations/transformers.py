"""transformers ``TrainerCallback``s that give a Trainer run x's preemption and whole checkpoints.

Trainer drives its own loop and writes its own checkpoint folders, so nothing in it reads
``accelerator.preemption_requested`` or writes a folder all at once. Two callbacks add what x gives
its own loop:

- ``PreemptionCallback`` reads the rank-agreed preemption request (a preemption signal, SLURM's
  ``--signal``, x-launch's marker) after every step; when it is set, every rank stops at that same
  step and Trainer writes its checkpoint. ``x-launch --requeue`` then requeues the job.
- ``CompleteCheckpoints`` marks each ``checkpoint-<step>`` folder complete (``x_checkpoint_complete``,
  written atomically once every rank has written its files); ``last_complete_checkpoint(output_dir)``
  is the newest marked folder, so a folder half-written when the job died is never resumed from
  (transformers' ``get_last_checkpoint`` takes the newest folder, whole or not).

Examples:
    >>> from x_runtime.integrations.transformers import CompleteCheckpoints, PreemptionCallback
    >>> trainer.add_callback(PreemptionCallback())  # doctest: +SKIP
    >>> trainer.add_callback(CompleteCheckpoints())  # doctest: +SKIP
    >>> trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from x_runtime.io.atomic import fsync_tree, write_file_atomic
from x_runtime.process.collectives import barrier
from x_runtime.process.operations.preemption import PreemptionWatch

logger = logging.getLogger(__name__)

__all__ = ["COMPLETE", "CompleteCheckpoints", "PreemptionCallback", "last_complete_checkpoint"]

COMPLETE = "x_checkpoint_complete"  # the marker in a checkpoint folder every rank finished writing


class PreemptionCallback(TrainerCallback):
    """Saves a checkpoint and ends training at the step where the job was asked to stop."""

    def __init__(self) -> None:
        self._watch: PreemptionWatch | None = None
        self.stopped_at: int | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._watch = PreemptionWatch.from_environment(args.world_size)  # installs the signal handlers

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self._watch is not None and self._watch.requested():
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
        return control


class CompleteCheckpoints(TrainerCallback):
    """Marks each Trainer checkpoint folder complete once every rank has written its part."""

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        barrier()  # every rank's files (its RNG state, its shards) are written
        if state.is_world_process_zero:
            folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
            fsync_tree(folder)
            write_file_atomic(folder / COMPLETE, lambda tmp: tmp.write_text(f"{state.global_step}\n"))
        barrier()


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-<step>`` folder of ``output_dir`` that ``CompleteCheckpoints`` marked, or None.

    A newer folder without the mark (the job died while writing it) is named in a warning and skipped.
    """
    found = []
    for folder in Path(output_dir).glob("checkpoint-*"):
        matched = re.fullmatch(r"checkpoint-(\d+)", folder.name)
        if matched and folder.is_dir():
            found.append((int(matched.group(1)), folder))
    for _step, folder in sorted(found, reverse=True):
        if (folder / COMPLETE).is_file():
            return str(folder)
        logger.warning("%s is incomplete (no %s: the job stopped while writing it); skipped", folder, COMPLETE)
    return None
