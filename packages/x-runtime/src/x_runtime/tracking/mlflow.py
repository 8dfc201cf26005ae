"""MLflow: one run per tracker; values MLflow cannot record are skipped with one warning per key."""

from __future__ import annotations

import os
from typing import Any

from x_runtime.tracking.base import GeneralTracker, _import_backend, _scalar, _SkipWarnings

__all__ = ["MLflowTracker"]


class MLflowTracker(GeneralTracker):
    """Logs to an MLflow run.

    MLflow's own environment variables (tracking URI, ``MLFLOW_RUN_ID``, ...) apply as usual.

    Args:
        experiment_name: The experiment to log under, created if missing; None uses MLflow's
            active or default experiment.
        logging_dir: Artifact location for a newly created experiment.
        run_id: Resume this run instead of starting a new one.
        tags: Tags for a new experiment and for the run.
        nested_run: Start the run nested in the active one.
        run_name: Name of a new run.
        description: Description of the run.

    Raises:
        ImportError: mlflow is not installed.

    Examples:
        >>> tracker = MLflowTracker("my-experiment", run_name="baseline")  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        nested_run: bool = False,
        run_name: str | None = None,
        description: str | None = None,
    ):
        super().__init__()
        self._mlflow = mlflow = _import_backend("mlflow", "mlflow")
        self.experiment_name = experiment_name
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        experiment_id = None
        if experiment_name is not None:
            experiment = mlflow.get_experiment_by_name(experiment_name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                experiment_id = mlflow.create_experiment(experiment_name, artifact_location=self.logging_dir, tags=tags)
        self.active_run = mlflow.start_run(
            run_id=run_id,
            experiment_id=experiment_id,
            run_name=run_name,
            nested=nested_run,
            tags=tags,
            description=description,
        )
        self._skips = _SkipWarnings("MLflow")

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as run parameters, in batches of MLflow's per-request limit.

        Values longer than MLflow's parameter length limit are skipped with a warning.

        Args:
            values: Hyperparameter names and values.
        """
        validation = getattr(getattr(self._mlflow, "utils", None), "validation", None)
        max_length = getattr(validation, "MAX_PARAM_VAL_LENGTH", 6000)
        per_batch = getattr(validation, "MAX_PARAMS_TAGS_PER_BATCH", 100)
        params = {}
        for key, value in values.items():
            if len(str(value)) > max_length:
                self._skips.skip(key, value, f"parameters of at most {max_length} characters")
            else:
                params[key] = value
        items = list(params.items())
        for start in range(0, len(items), per_batch):
            self._mlflow.log_params(dict(items[start : start + per_batch]))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log the numeric ``values`` as metrics; others are skipped with a warning.

        Args:
            values: Metric names and values.
            step: The run step.
            **kwargs: Passed to ``mlflow.log_metrics``.
        """
        metrics = {}
        for key, value in values.items():
            number = _scalar(value)
            if number is None:
                self._skips.skip(key, value, "numbers only")
            else:
                metrics[key] = number
        self._mlflow.log_metrics(metrics, step=step, **kwargs)

    def finish(self) -> None:
        """End the run."""
        self._mlflow.end_run()
