"""The ``Accelerator``'s ``preemption_requested``: a mixin over the process's ``PreemptionWatch``."""

from __future__ import annotations

from x_runtime.accelerator.fields import AcceleratorFields
from x_runtime.process.operations.preemption import PreemptionWatch

__all__ = ["PreemptionMethods"]


class PreemptionMethods(AcceleratorFields):
    """``preemption_requested``, agreed by every rank (``process.preemption`` says how)."""

    _preemption: PreemptionWatch | None = None  # made at the first access: it installs signal handlers

    @property
    def preemption_requested(self) -> bool:
        """Whether the job was asked to stop; True on every rank at the same access.

        Read it once per step on every rank; when True, save and leave the loop::

            if accelerator.preemption_requested:
                accelerator.save_state()
                break
        """
        if self._preemption is None:
            self._preemption = PreemptionWatch.from_environment(self.process_state.world_size)
        return self._preemption.requested()
