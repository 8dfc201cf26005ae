"""Weights & Biases: one wandb run per tracker."""

from __future__ import annotations

from typing import Any

from x_runtime.tracking.base import GeneralTracker, import_backend

__all__ = ["WandBTracker"]


class WandBTracker(GeneralTracker):
    """Logs to a Weights & Biases run.

    Args:
        run_name: The wandb project name (as in Accelerate).
        **kwargs: Passed to ``wandb.init`` (``entity``, ``name``, ``tags``, ``config``, ...).

    Raises:
        ImportError: wandb is not installed.

    Examples:
        >>> tracker = WandBTracker("my-project", mode="offline")  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        wandb = import_backend("wandb", "wandb")
        self.run_name = run_name
        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Add ``values`` to the run's config (changing values already there is allowed).

        Args:
            values: Hyperparameter names and values.
        """
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` to the run; wandb accepts any of its own media types as values.

        Args:
            values: Metric names and values.
            step: The run step.
            **kwargs: Passed to ``run.log``.
        """
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        """Finish the run (uploads what is pending)."""
        self.run.finish()
