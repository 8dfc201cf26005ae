"""SwanLab: one SwanLab run per tracker (cloud, or local/offline as ``mode`` says)."""

from __future__ import annotations

from typing import Any

from x_runtime.tracking.base import GeneralTracker, import_backend

__all__ = ["SwanLabTracker"]


class SwanLabTracker(GeneralTracker):
    """Logs to a SwanLab run.

    ``mode="local"`` or ``"offline"`` (or ``SWANLAB_MODE``) keeps the run on this machine, under
    ``logdir`` (or ``SWANLAB_LOG_DIR``).

    Args:
        run_name: The SwanLab project name.
        **kwargs: Passed to ``swanlab.init`` (``experiment_name``, ``description``, ``tags``,
            ``mode``, ``logdir``, ...).

    Raises:
        ImportError: swanlab is not installed.

    Examples:
        >>> tracker = SwanLabTracker("my-project", mode="offline")  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "swanlab"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        self._swanlab = import_backend("swanlab", "swanlab")
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run = self._swanlab.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Add ``values`` to the run's config (values already there are replaced).

        Accelerate also passes ``allow_val_change=True``, which SwanLab's ``config.update`` stores
        as one more config entry, and adds a ``FRAMEWORK`` entry; x stores ``values`` only.

        Args:
            values: Hyperparameter names and values (bool, str, int, float or None).
        """
        self._swanlab.config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` to the run; SwanLab takes numbers and its own media types.

        Args:
            values: Metric names and values.
            step: The step; without one SwanLab counts on from the last.
            **kwargs: Passed to ``swanlab.log`` (``print_to_console``, ...).
        """
        self.run.log(values, step=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log each key's list of images (``np.ndarray`` or ``PIL.Image``) as ``swanlab.Image``.

        Args:
            values: Image names and lists of images.
            step: The step.
            **kwargs: Passed to ``swanlab.log``.
        """
        image = self._swanlab.Image
        for key, images in values.items():
            self.log({key: [image(item) for item in images]}, step=step, **kwargs)

    def finish(self) -> None:
        """Finish the run."""
        self.run.finish()
