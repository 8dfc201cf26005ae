"""The ``Accelerator``'s tracking methods: start the trackers ``log_with`` names, log, finish.

A mixin of the facade; trackers run on the main process only. The registry is imported when
``init_trackers`` runs.
"""

from __future__ import annotations

import gc
from typing import Any

from x_runtime.accelerator.fields import AcceleratorFields

__all__ = ["TrackingMethods"]


class TrackingMethods(AcceleratorFields):
    """Accelerate's tracking methods, over ``self.trackers``."""

    # --- tracking --------------------------------------------------------------------------
    def init_trackers(
        self, project_name: str, config: dict[str, Any] | None = None, init_kwargs: dict[str, Any] | None = None
    ) -> None:
        """Start the trackers named by ``log_with`` (main process only) and store ``config``."""
        if not self.process_state.is_main_process or self.log_with is None:
            return
        from x_runtime.tracking.registry import build_trackers

        self.trackers = build_trackers(
            self.log_with, project_name, self.project_configuration.logging_dir, init_kwargs or {}
        )
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"no tracker named {name!r}; started: {[t.name for t in self.trackers] or 'none'}")

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None) -> None:
        """Log ``values`` to every tracker (main process only)."""
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def end_training(self) -> None:
        """Close trackers, wait for every process, and release what was prepared.

        The process group stays up until the interpreter exits (then it is left cleanly):
        re-creating a group in the same process after destroying it hangs the first collective
        under torchrun (torch 2.13, its agent's store), so a later ``Accelerator`` in this
        process joins the existing group instead.
        """
        # The trackers stay listed, finished, as Accelerate leaves them: scripts read their runs
        # (accelerator.get_tracker("dvclive").tracker, a run's id or folder) after training.
        for tracker in self.trackers:
            tracker.finish()
        self.process_state.wait_for_everyone()
        self._prepared.clear()
        gc.collect()
