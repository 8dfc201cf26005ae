"""Aim: one Aim run per tracker, in an Aim repository (the logging directory)."""

from __future__ import annotations

import os
from typing import Any

from x_runtime.tracking.base import GeneralTracker, SkipWarnings, import_backend, scalar_value

__all__ = ["AimTracker"]


class AimTracker(GeneralTracker):
    """Logs to an Aim run stored in the Aim repository at ``logging_dir`` (``.aim`` inside it).

    Args:
        run_name: The run's name.
        logging_dir: The Aim repository's folder (``Accelerator(project_dir=...)``'s logging directory
            when built by ``init_trackers``).
        **kwargs: Passed to ``aim.Run`` (``experiment``, ``capture_terminal_logs``, ...). A ``repo``
            given here is used instead of ``logging_dir``.

    Raises:
        ImportError: aim is not installed.

    Examples:
        >>> tracker = AimTracker("baseline", "runs")  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any):
        super().__init__()
        self._aim = import_backend("aim", "aim")
        self.run_name = run_name
        repo = kwargs.pop("repo", logging_dir)
        self.aim_repo_path = None if repo is None else os.fspath(repo)
        self.init_kwargs = kwargs
        self.writer = self._aim.Run(repo=self.aim_repo_path, **kwargs)
        self.writer.name = run_name
        self._skips = SkipWarnings("Aim")

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` as the run's ``hparams``.

        Args:
            values: Hyperparameter names and values (nested dicts are kept).
        """
        self.writer["hparams"] = values

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Track each value as a sequence named by its key.

        Numbers (one-element tensors as the number they hold), Aim's own objects (``aim.Image``,
        ``aim.Text``, ...), lists and dicts of them go to ``Run.track``; strings and None, which
        Aim refuses with an error, are skipped with one warning per key.

        Args:
            values: Metric names and values.
            step: The step the values belong to.
            **kwargs: Passed to ``Run.track`` (``epoch``, ``context``).
        """
        for key, value in values.items():
            number = scalar_value(value)
            if number is not None:
                self.writer.track(number, name=key, step=step, **kwargs)
            elif value is None or isinstance(value, (str, bytes)):
                self._skips.skip(key, value, "numbers and Aim objects (aim.Text for text)")
            else:
                self.writer.track(value, name=key, step=step, **kwargs)

    def log_images(
        self, values: dict[str, Any], step: int | None = None, kwargs: dict[str, dict] | None = None
    ) -> None:
        """Track each image (``np.ndarray`` or ``PIL.Image``, or an ``(image, caption)`` pair) as ``aim.Image``.

        Args:
            values: Image names and images.
            step: The step the images belong to.
            kwargs: Options by destination: ``{"aim_image": {...}}`` for ``aim.Image``,
                ``{"track": {...}}`` for ``Run.track``.
        """
        image_options = (kwargs or {}).get("aim_image", {})
        track_options = (kwargs or {}).get("track", {})
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(
                self._aim.Image(image, caption=caption, **image_options), name=key, step=step, **track_options
            )

    def finish(self) -> None:
        """Close the run."""
        self.writer.close()
