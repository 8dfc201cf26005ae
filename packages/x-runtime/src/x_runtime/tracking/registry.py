"""Experiment trackers behind ``Accelerator(log_with=...)``, ``init_trackers``, ``log`` and ``end_training``.

Trackers follow Accelerate's ``GeneralTracker`` interface, so custom trackers written for
Accelerate work here. Differences from Accelerate:

- A tracker named explicitly whose package is missing is an error naming the ``pip install``
  command, not a debug message and a silently absent tracker.
- Misspelt tracker names get a "did you mean" hint.
- Built-in trackers open their run in ``__init__`` (``start`` remains as a hook for custom
  trackers); the caller builds them on the processes that log, normally the main one only.
- Values a backend cannot record (a list sent to TensorBoard, a string sent to MLflow) are skipped
  with one warning per key, since the same ``log`` call feeds every tracker.
- TensorBoard hyperparameters go into the run's own event file, not a new timestamped sub-run.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

from x_runtime.tracking.aim import AimTracker
from x_runtime.tracking.base import GeneralTracker, missing_attributes
from x_runtime.tracking.clearml import ClearMLTracker
from x_runtime.tracking.comet_ml import CometMLTracker
from x_runtime.tracking.dvclive import DVCLiveTracker
from x_runtime.tracking.mlflow import MLflowTracker
from x_runtime.tracking.swanlab import SwanLabTracker
from x_runtime.tracking.tensorboard import TensorBoardTracker
from x_runtime.tracking.trackio import TrackioTracker
from x_runtime.tracking.wandb import WandBTracker

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackerSpec",
    "TrackioTracker",
    "WandBTracker",
    "available_trackers",
    "build_trackers",
    "filter_trackers",
    "register_tracker_class",
]

_log = logging.getLogger(__name__)


class LoggerType(str, Enum):
    """Names of the built-in trackers; ``ALL`` selects every one whose package is installed.

    Examples:
        >>> LoggerType("tensorboard") is LoggerType.TENSORBOARD
        True
        >>> str(LoggerType.WANDB)
        'wandb'
    """

    ALL = "all"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    AIM = "aim"
    COMETML = "comet_ml"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"

    def __str__(self) -> str:
        return self.value


# Built-in trackers: class, the modules any one of which makes it usable, and the pip package.
_BUILTIN: dict[LoggerType, tuple[type[GeneralTracker], tuple[str, ...], str]] = {
    LoggerType.TENSORBOARD: (TensorBoardTracker, ("tensorboard", "tensorboardX"), "tensorboard"),
    LoggerType.WANDB: (WandBTracker, ("wandb",), "wandb"),
    LoggerType.MLFLOW: (MLflowTracker, ("mlflow",), "mlflow"),
    LoggerType.AIM: (AimTracker, ("aim",), "aim"),
    LoggerType.COMETML: (CometMLTracker, ("comet_ml",), "comet_ml"),
    LoggerType.CLEARML: (ClearMLTracker, ("clearml",), "clearml"),
    LoggerType.DVCLIVE: (DVCLiveTracker, ("dvclive",), "dvclive"),
    LoggerType.SWANLAB: (SwanLabTracker, ("swanlab",), "swanlab"),
    LoggerType.TRACKIO: (TrackioTracker, ("trackio",), "trackio"),
}


# Every tracker a name in log_with may ask for: the built-in ones, and those register_tracker_class adds.
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {str(kind): cls for kind, (cls, _, _) in _BUILTIN.items()}


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Let ``log_with`` name ``tracker_class`` by its ``name``, as it names the built-in trackers.

    ``init_trackers`` builds it as the built-in ones: ``tracker_class(project_name, **init_kwargs)``,
    with the logging directory as second argument when ``requires_logging_directory`` is true.
    Register before building the ``Accelerator`` that names it.

    Raises:
        ValueError: not a ``GeneralTracker`` subclass, or without a ``name`` or a
            ``requires_logging_directory`` class attribute.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class: expected a GeneralTracker subclass, got {tracker_class!r}")
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_tracker_class: {tracker_class.__name__} needs a non-empty `name` class attribute")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            f"register_tracker_class: {tracker_class.__name__} needs a `requires_logging_directory` class "
            "attribute (True when it writes under the accelerator's logging directory)"
        )
    if name.strip().lower() == str(LoggerType.ALL):
        raise ValueError("register_tracker_class: 'all' selects the built-in trackers; choose another name")
    taken = _registered_key(name)  # names match whatever their case, as log_with's do
    if taken is not None:
        warnings.warn(
            f"register_tracker_class: the tracker name {taken!r} was taken by "
            f"{LOGGER_TYPE_TO_CLASS.pop(taken).__name__}; {tracker_class.__name__} replaces it",
            UserWarning,
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _registered_key(name: str) -> str | None:
    wanted = name.strip().lower()
    return next((key for key in LOGGER_TYPE_TO_CLASS if key.strip().lower() == wanted), None)


def _class_of(chosen: LoggerType | str) -> type[GeneralTracker]:
    key = _registered_key(str(chosen))
    if key is not None:
        return LOGGER_TYPE_TO_CLASS[key]
    return _BUILTIN[LoggerType(str(chosen))][0]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a spec-less module
        return False


def available_trackers() -> list[LoggerType]:
    """The built-in trackers whose packages are installed.

    Returns:
        Tracker types in ``LoggerType`` order.

    Examples:
        >>> LoggerType.ALL in available_trackers()
        False
    """
    return [kind for kind, (_, modules, _) in _BUILTIN.items() if any(_installed(m) for m in modules)]


TrackerSpec = str | LoggerType | GeneralTracker


def filter_trackers(
    log_with: TrackerSpec | Iterable[TrackerSpec] | None,
    logging_dir: str | os.PathLike[str] | None = None,
) -> list[LoggerType | str | GeneralTracker]:
    """Validate ``log_with`` and resolve it to tracker types and custom tracker instances.

    Args:
        log_with: A tracker name (built-in, or given to ``register_tracker_class``), ``LoggerType``,
            ``GeneralTracker`` instance, or a list of them. ``"all"`` adds every built-in tracker
            whose package is installed.
        logging_dir: The directory for trackers that write local files (TensorBoard, Aim).

    Returns:
        The trackers in request order, without repeats: ``LoggerType`` members for built-in
        trackers (they are also ``str``), the name of a registered class, custom instances as given.

    Raises:
        ValueError: an unknown tracker name, or a tracker needing a directory without ``logging_dir``.
        ImportError: a tracker named explicitly whose package is not installed.
        TypeError: an entry that is neither a name nor a ``GeneralTracker``, or a custom tracker
            lacking required attributes.

    Examples:
        >>> filter_trackers(["tensorboard", LoggerType.TENSORBOARD], logging_dir="runs")
        [<LoggerType.TENSORBOARD: 'tensorboard'>]
        >>> filter_trackers(None)
        []
    """
    if log_with is None:
        return []
    entries: list[TrackerSpec]
    if isinstance(log_with, (str, GeneralTracker)) or not isinstance(log_with, Iterable):
        entries = [log_with]
    else:
        entries = list(log_with)
    selected: list[LoggerType | str | GeneralTracker] = []
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            missing = missing_attributes(entry)
            if missing:
                raise TypeError(f"custom tracker {entry!r} lacks {', '.join(missing)}")
            if not any(entry is chosen for chosen in selected):
                selected.append(entry)
            continue
        if not isinstance(entry, str):
            raise TypeError(
                f"log_with entries must be tracker names or GeneralTracker instances, got {type(entry).__name__}"
            )
        kind = _parse_name(entry)
        if kind is LoggerType.ALL:
            kinds: list[LoggerType | str] = list(available_trackers())
        elif isinstance(kind, LoggerType) and _class_of(kind) is _BUILTIN[kind][0]:
            _, modules, package = _BUILTIN[kind]
            if not any(_installed(m) for m in modules):
                raise ImportError(f"log_with={str(kind)!r} needs the {package} package: pip install {package}")
            kinds = [kind]
        else:  # a registered class (perhaps under a built-in name): its package is its own affair
            kinds = [kind]
        selected.extend(k for k in kinds if k not in selected)

    for chosen in selected:
        needs_dir = not isinstance(chosen, GeneralTracker) and _class_of(chosen).requires_logging_directory
        if needs_dir and logging_dir is None:
            raise ValueError(
                f"Logging with `{chosen}` requires a `logging_dir`: the tracker writes files; "
                "pass project_dir (or logging_dir) to the Accelerator"
            )
    return selected


def _parse_name(entry: str) -> LoggerType | str:
    name = str(entry).strip().lower()
    try:
        return LoggerType(name)
    except ValueError:
        registered = _registered_key(name)
        if registered is not None:
            return registered
        valid = [kind.value for kind in LoggerType]
        valid += [key for key in LOGGER_TYPE_TO_CLASS if key not in valid]
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown tracker {entry!r}{hint} Valid trackers: {', '.join(valid)}") from None


def build_trackers(
    log_with: TrackerSpec | Iterable[TrackerSpec] | None,
    project_name: str,
    logging_dir: str | os.PathLike[str] | None = None,
    init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[GeneralTracker]:
    """Create (and ``start``) the trackers ``log_with`` asks for, as ``Accelerator.init_trackers`` does.

    Call it on the processes that should log (for built-in trackers, the main process): the
    built-in trackers open their run here.

    Args:
        log_with: As for ``filter_trackers``.
        project_name: The run name (TensorBoard, Aim), project (wandb, Comet, ClearML, SwanLab,
            trackio) or experiment (MLflow); DVCLive does not use it.
        logging_dir: Directory for trackers that write local files.
        init_kwargs: Per-tracker constructor keywords keyed by tracker name, e.g.
            ``{"tensorboard": {"flush_secs": 10}}``.

    Returns:
        Tracker instances in request order; custom instances are passed through.

    Raises:
        ValueError, ImportError, TypeError: as for ``filter_trackers``.

    Examples:
        >>> import tempfile
        >>> trackers = build_trackers("tensorboard", "demo", tempfile.mkdtemp(), {"tensorboard": {"flush_secs": 5}})
        >>> [t.name for t in trackers]
        ['tensorboard']
        >>> for t in trackers:
        ...     t.finish()
    """
    # str() because a LoggerType key hashes differently from its name.
    init_kwargs = {str(key): value for key, value in (init_kwargs or {}).items()}
    trackers: list[GeneralTracker] = []
    opened: list[GeneralTracker] = []
    try:
        for chosen in filter_trackers(log_with, logging_dir):
            if isinstance(chosen, GeneralTracker):
                tracker = chosen
            else:
                cls = _class_of(chosen)
                # Each built-in class takes (name, [logging_dir,] **kwargs), not GeneralTracker's own arguments.
                make: Callable[..., GeneralTracker] = cls
                kwargs = dict(init_kwargs.get(str(chosen), {}))
                if cls.requires_logging_directory:
                    tracker = make(project_name, logging_dir, **kwargs)
                else:
                    tracker = make(project_name, **kwargs)
                opened.append(tracker)
            tracker.start()
            trackers.append(tracker)
    except BaseException:
        # Close the runs this call opened, so a failure of a later tracker leaves no open writers.
        for tracker in opened:
            try:
                tracker.finish()
            except Exception:
                _log.exception("closing the %s tracker after a failed build_trackers", tracker.name)
        raise
    unused = sorted(set(init_kwargs) - {str(getattr(t, "name", "")) for t in trackers})
    if unused:
        _log.warning("init_kwargs for %s ignored: no such tracker is in use", ", ".join(unused))
    return trackers
