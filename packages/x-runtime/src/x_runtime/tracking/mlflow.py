"""MLflow: one run per tracker; values MLflow cannot record are skipped with one warning per key."""

from __future__ import annotations

import json
import os
from typing import Any

from x_runtime.core.settings import current_settings
from x_runtime.process.collectives import rank
from x_runtime.tracking.base import GeneralTracker, SkipWarnings, import_backend, scalar_value

__all__ = ["MLflowTracker"]

_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f")


def _flag(text: str) -> bool:
    """``MLFLOW_NESTED_RUN``'s text as a bool (as Accelerate's ``str_to_bool`` reads it)."""
    value = text.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"MLFLOW_NESTED_RUN={text!r} is not a boolean: set it to true or false (1/0, yes/no, on/off)")
    return value in _TRUE


class MLflowTracker(GeneralTracker):
    """Logs to an MLflow run, opened by ``start`` (``init_trackers`` calls it).

    As in Accelerate, ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (a JSON
    object) and ``MLFLOW_NESTED_RUN`` take priority over the matching arguments; MLflow's own
    variables (the tracking URI, ...) apply as usual.

    Args:
        experiment_name: The experiment to log under, created if missing; None uses MLflow's
            active or default experiment.
        logging_dir: Artifact location for a newly created experiment.
        run_id: Resume this run instead of starting a new one.
        tags: Tags for a new experiment and for the run (a dict, or its JSON text).
        nested_run: Start the run nested in the active one.
        run_name: Name of a new run.
        description: Description of the run.

    Raises:
        ImportError: mlflow is not installed.
        ValueError: ``MLFLOW_NESTED_RUN`` is not a boolean.

    Examples:
        >>> tracker = MLflowTracker("my-experiment", run_name="baseline")  # doctest: +SKIP
        >>> tracker.start()  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.log_artifact("config.yaml")  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool = False,
        run_name: str | None = None,
        description: str | None = None,
    ):
        super().__init__()
        self._mlflow = import_backend("mlflow", "mlflow")
        settings = current_settings()  # MLflow's own variables win over the arguments, as in Accelerate
        tags = settings.raw("MLFLOW_TAGS", tags)
        nested = settings.raw("MLFLOW_NESTED_RUN")
        self.experiment_name = settings.raw("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.run_id = settings.raw("MLFLOW_RUN_ID", run_id)
        self.tags: dict[str, Any] | None = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = _flag(nested) if nested is not None else bool(nested_run)
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None
        self._skips = SkipWarnings("MLflow")

    def start(self) -> None:
        """Open the run: in ``experiment_name`` (created with ``logging_dir`` as its artifact location when missing)."""
        mlflow = self._mlflow
        experiment_id = None
        if self.experiment_name is not None:
            experiment = mlflow.get_experiment_by_name(self.experiment_name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                experiment_id = mlflow.create_experiment(
                    self.experiment_name, artifact_location=self.logging_dir, tags=self.tags
                )
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    @property
    def tracker(self) -> Any:
        return self.active_run

    def _here(self) -> bool:
        # As Accelerate's trackers: a tracker built on every process acts on the main one only.
        return not self.main_process_only or rank() == 0

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
            number = scalar_value(value)
            if number is None:
                self._skips.skip(key, value, "numbers only")
            else:
                metrics[key] = number
        self._mlflow.log_metrics(metrics, step=step, **kwargs)

    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save ``figure`` (matplotlib or plotly) as the run's artifact ``artifact_file``.

        Args:
            figure: The figure.
            artifact_file: Its path in the run's artifacts, with the image format's suffix (``plots/loss.png``).
            **save_kwargs: Passed to ``mlflow.log_figure`` (``save_kwargs={"dpi": 200}``, ...).
        """
        if self._here():
            self._mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    def log_artifact(self, local_path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts (under ``artifact_path`` when given).

        Args:
            local_path: The file.
            artifact_path: The folder in the run's artifacts; None: their root.
        """
        if self._here():
            self._mlflow.log_artifact(local_path=os.fspath(local_path), artifact_path=artifact_path)

    def log_artifacts(self, local_dir: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy everything in the folder ``local_dir`` into the run's artifacts (under ``artifact_path`` when given).

        Args:
            local_dir: The folder.
            artifact_path: The folder in the run's artifacts; None: their root.
        """
        if self._here():
            self._mlflow.log_artifacts(local_dir=os.fspath(local_dir), artifact_path=artifact_path)

    def finish(self) -> None:
        """End the run."""
        self._mlflow.end_run()
