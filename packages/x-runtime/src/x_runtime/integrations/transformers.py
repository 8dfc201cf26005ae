"""A transformers ``TrainerCallback`` that gives a Trainer run x's preemption: save, stop, resume exactly.

Trainer drives its own loop, so nothing in it reads ``accelerator.preemption_requested``. This
callback reads the same rank-agreed request (a preemption signal, SLURM's ``--signal``, x-launch's
marker) after every step; when it is set, every rank stops at that same step and Trainer writes its
checkpoint. ``x-launch --requeue`` then requeues the job, and the script resumes with
``trainer.train(resume_from_checkpoint=get_last_checkpoint(output_dir))``.

Examples:
    >>> from x_runtime.integrations.transformers import PreemptionCallback
    >>> trainer.add_callback(PreemptionCallback())  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from x_runtime.process.preemption import PreemptionWatch

__all__ = ["PreemptionCallback"]


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
