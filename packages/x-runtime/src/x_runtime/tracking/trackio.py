"""Trackio: one trackio run per tracker, stored in trackio's local database (optionally synced to a Space)."""

from __future__ import annotations

from typing import Any

from x_runtime.tracking.base import GeneralTracker, import_backend

__all__ = ["TrackioTracker"]


class TrackioTracker(GeneralTracker):
    """Logs to a trackio run.

    trackio keeps each project in a local SQLite database (under ``TRACKIO_DIR``, default in the
    Hugging Face cache); ``space_id`` also syncs it to a Hugging Face Space.

    Args:
        run_name: The trackio project name.
        **kwargs: Passed to ``trackio.init`` (``name``, ``space_id``, ``config``, ...).

    Raises:
        ImportError: trackio is not installed.

    Examples:
        >>> tracker = TrackioTracker("my-project", name="baseline")  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "trackio"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        self._trackio = import_backend("trackio", "trackio")
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run = self._trackio.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Add ``values`` to the run's config (changing values already there is allowed).

        Args:
            values: Hyperparameter names and values (bool, str, int, float or None).
        """
        self._trackio.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` to the run.

        Args:
            values: Metric names and values.
            step: The step the values belong to.
            **kwargs: Passed to the run's ``log``.
        """
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        """Finish the run (waits for what is still being written)."""
        self.run.finish()
