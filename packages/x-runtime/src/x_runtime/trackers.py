"""The experiment trackers behind ``Accelerator(log_with=...)``: TensorBoard, Weights & Biases, MLflow.

Each backend is imported only when its tracker is built; a missing package is an ImportError
that names the install command.
"""

from __future__ import annotations

import importlib.util
import logging
import numbers
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["GeneralTracker", "MLflowTracker", "TensorBoardTracker", "WandBTracker"]

_log = logging.getLogger(__name__)


class GeneralTracker:
    """Base class of experiment trackers (Accelerate's interface).

    Subclasses define ``name`` (str), ``requires_logging_directory`` (bool) and a ``tracker``
    property returning the backend's own object (a ``SummaryWriter``, a wandb run, ...), and
    override the methods below as the backend needs. ``main_process_only`` (default True) tells the
    accelerator to call the tracker on the main process only.

    Args:
        _blank: Skip the check for required attributes (a do-nothing stand-in tracker).

    Raises:
        NotImplementedError: a subclass lacks ``name``, ``requires_logging_directory`` or ``tracker``.
    """

    main_process_only: bool = True

    def __init__(self, _blank: bool = False):
        if not _blank:
            missing = _missing_attributes(self)
            if missing:
                raise NotImplementedError(
                    f"{type(self).__name__} is missing required tracker attributes: {', '.join(missing)}; "
                    "define them in the class"
                )

    def start(self) -> None:
        """Hook called once after construction, before any configuration or values are logged."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record ``values`` as the run's hyperparameters.

        Args:
            values: Hyperparameter names and values (bool, str, int, float or None).
        """

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` for ``step``.

        Args:
            values: Metric names and values.
            step: The training step the values belong to.
            **kwargs: Backend-specific options.
        """

    def finish(self) -> None:
        """Flush and close the run."""


def _missing_attributes(tracker: object) -> list[str]:
    missing = [f"`{attr}`" for attr in ("name", "requires_logging_directory") if not hasattr(tracker, attr)]
    # dir() rather than hasattr(): `tracker` is usually a property that may fail before start().
    if "tracker" not in dir(tracker):
        missing.append("`tracker`")
    return missing


def _scalar(value: Any) -> float | int | None:
    """``value`` as a Python number when it is a real scalar (including a one-element tensor)."""
    if isinstance(value, numbers.Real):
        return value  # type: ignore[return-value]
    item = getattr(value, "item", None)
    numel = getattr(value, "numel", None)
    if callable(item) and callable(numel) and numel() == 1:
        result = item()
        if isinstance(result, numbers.Real):
            return result  # type: ignore[return-value]
    return None


class _SkipWarnings:
    """Warns once per (tracker, key) about a value the backend cannot record."""

    def __init__(self, tracker_name: str):
        self._tracker_name = tracker_name
        self._seen: set[str] = set()

    def skip(self, key: str, value: Any, accepted: str) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        _log.warning(
            "%s cannot record %r (a %s); it accepts %s, so this key is skipped",
            self._tracker_name,
            key,
            type(value).__name__,
            accepted,
        )


class TensorBoardTracker(GeneralTracker):
    """Writes to TensorBoard event files under ``logging_dir/run_name``.

    Uses ``torch.utils.tensorboard`` (which needs the ``tensorboard`` package), or ``tensorboardX``
    when that is what is installed.

    Args:
        run_name: The run's name, a sub-directory of ``logging_dir``.
        logging_dir: Where runs are stored.
        **kwargs: Passed to ``SummaryWriter`` (e.g. ``flush_secs``).

    Raises:
        ImportError: neither ``tensorboard`` nor ``tensorboardX`` is installed.

    Examples:
        >>> import tempfile
        >>> tracker = TensorBoardTracker("demo", tempfile.mkdtemp())
        >>> tracker.log({"loss": 0.5, "note": "warmup", "lr": {"head": 0.1, "body": 0.01}}, step=1)
        >>> tracker.finish()
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any):
        super().__init__()
        summary_writer, self._hparams = _import_tensorboard()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer = summary_writer(self.logging_dir, **kwargs)
        self._skips = _SkipWarnings("TensorBoard")

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` as the run's hyperparameters (TensorBoard's HPARAMS tab).

        Nested dicts are flattened to ``outer/inner`` keys; values other than bool, str, int and
        float (None, lists, ...) are stored as their ``str``.

        Args:
            values: Hyperparameter names and values.

        Examples:
            >>> import tempfile
            >>> tracker = TensorBoardTracker("demo", tempfile.mkdtemp())
            >>> tracker.store_init_configuration({"lr": 1e-3, "optimizer": {"name": "adamw"}})
            >>> tracker.finish()
        """
        flat = _flatten_hparams(values)
        experiment, session_start, session_end = self._hparams(flat, {})
        get_file_writer = getattr(self.writer, "_get_file_writer", None)
        if get_file_writer is None:
            # SummaryWriter.add_hparams writes to a new timestamped sub-run; "." keeps it in this run.
            self.writer.add_hparams(flat, {}, run_name=".")
        else:
            file_writer = get_file_writer()
            for summary in (experiment, session_start, session_end):
                file_writer.add_summary(summary)
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Write scalars, text and scalar groups, then flush so readers see them at once.

        Args:
            values: Numbers (and one-element tensors) become scalars, strings become text, dicts of
                numbers become a group of scalars (``add_scalars``). Other values are skipped with
                a warning.
            step: The global step.
            **kwargs: Passed to ``add_scalar``, ``add_text`` or ``add_scalars``.

        Examples:
            >>> import tempfile
            >>> tracker = TensorBoardTracker("demo", tempfile.mkdtemp())
            >>> tracker.log({"loss": 0.25}, step=10)
            >>> tracker.finish()
        """
        for key, value in values.items():
            number = _scalar(value)
            if number is not None:
                self.writer.add_scalar(key, number, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, Mapping) and value:
                group = {str(k): _scalar(v) for k, v in value.items()}
                if any(v is None for v in group.values()):
                    self._skips.skip(key, value, "numbers, strings and dicts of numbers")
                else:
                    self.writer.add_scalars(key, group, global_step=step, **kwargs)
            else:
                self._skips.skip(key, value, "numbers, strings and dicts of numbers")
        self.writer.flush()

    def finish(self) -> None:
        """Flush and close the event files."""
        self.writer.close()


def _import_tensorboard() -> tuple[Any, Any]:
    try:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
            from tensorboardX.summary import hparams
        except ImportError:
            raise ImportError("TensorBoard logging needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter, hparams


def _flatten_hparams(values: Mapping[str, Any], prefix: str = "") -> dict[str, bool | str | int | float]:
    flat: dict[str, bool | str | int | float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten_hparams(value, f"{name}/"))
        elif isinstance(value, (bool, str)):
            flat[name] = value
        else:
            number = _scalar(value)
            flat[name] = number if number is not None else str(value)
    return flat


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
        wandb = _import_backend("wandb", "wandb")
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


def _import_backend(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"the {module} tracker needs the {package} package: pip install {package}") from None
