"""Comet: one Comet experiment per tracker, online or offline as comet_ml's own settings say."""

from __future__ import annotations

from typing import Any

from x_runtime.core.versions import compare_versions
from x_runtime.tracking.base import GeneralTracker, SkipWarnings, import_backend, scalar_value

__all__ = ["CometMLTracker"]

# comet_ml.start (experiment reuse, offline mode through its arguments) arrived in this release.
_START_SINCE = "3.41.0"


class CometMLTracker(GeneralTracker):
    """Logs to a Comet experiment.

    The API key and workspace come from comet_ml's configuration (``~/.comet.config``,
    ``COMET_API_KEY``, ...). ``online=False`` with an ``ExperimentConfig(offline_directory=...)``
    writes the experiment as a zip file to upload later.

    Args:
        run_name: The Comet project name.
        **kwargs: Passed to ``comet_ml.start`` (``workspace``, ``online``, ``experiment_config``,
            ...); for comet_ml older than 3.41.0, to ``comet_ml.Experiment``.

    Raises:
        ImportError: comet_ml is not installed.

    Examples:
        >>> from comet_ml import ExperimentConfig  # doctest: +SKIP
        >>> config = ExperimentConfig(offline_directory="runs/comet")  # doctest: +SKIP
        >>> tracker = CometMLTracker("my-project", online=False, experiment_config=config)  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        comet_ml = import_backend("comet_ml", "comet_ml")
        self.run_name = run_name
        self.init_kwargs = kwargs
        if compare_versions(str(comet_ml.__version__), ">=", _START_SINCE):
            self.writer = comet_ml.start(project_name=run_name, **kwargs)
        else:
            self.writer = comet_ml.Experiment(project_name=run_name, **kwargs)
        self._skips = SkipWarnings("Comet")

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as the experiment's parameters (``Experiment.log_parameters``).

        Args:
            values: Hyperparameter names and values (bool, str, int, float or None).
        """
        self.writer.log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log numbers as metrics, strings as "other" values and dicts as groups of metrics.

        A given ``step`` becomes the experiment's current step first. Other values are skipped
        with one warning per key.

        Args:
            values: Metric names and values.
            step: The step the values belong to.
            **kwargs: Passed to ``log_metric``, ``log_other`` or ``log_metrics``, by the value's kind.
        """
        if step is not None:
            self.writer.set_step(step)
        for key, value in values.items():
            number = scalar_value(value)
            if number is not None:
                self.writer.log_metric(key, number, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)
            else:
                self._skips.skip(key, value, "numbers, strings and dicts of numbers")

    def finish(self) -> None:
        """End the experiment (uploads it, or closes its offline zip file)."""
        self.writer.end()
