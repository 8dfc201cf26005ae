"""``GeneralTracker``, the interface every tracker follows (Accelerate's), and what the backends share.

Each backend (``tensorboard``, ``wandb``, ``mlflow``) is imported only when its tracker is
built; a missing package is an ImportError that names the install command.
"""

from __future__ import annotations

import importlib.util
import logging
import numbers
from typing import TYPE_CHECKING, Any

__all__ = ["GeneralTracker", "missing_attributes"]

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
    # Declared, not defined: the subclass supplies them, and __init__ checks it did (hasattr/dir).
    name: str
    requires_logging_directory: bool

    if TYPE_CHECKING:  # a real property here would hide a subclass's missing ``tracker`` from that check

        @property
        def tracker(self) -> Any:
            """The backend's own object (a ``SummaryWriter``, a wandb run, ...)."""

    def __init__(self, _blank: bool = False):
        if not _blank:
            missing = missing_attributes(self)
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


def missing_attributes(tracker: object) -> list[str]:
    """The attributes a custom tracker lacks that x needs (named for the error message)."""
    missing = [f"`{attr}`" for attr in ("name", "requires_logging_directory") if not hasattr(tracker, attr)]
    # dir() rather than hasattr(): `tracker` is usually a property that may fail before start().
    if "tracker" not in dir(tracker):
        missing.append("`tracker`")
    return missing


def scalar_value(value: Any) -> float | int | None:
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


class SkipWarnings:
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


def import_backend(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"the {module} tracker needs the {package} package: pip install {package}") from None
