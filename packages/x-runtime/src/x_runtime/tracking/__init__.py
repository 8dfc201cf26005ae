"""Experiment tracking behind ``Accelerator(log_with=...)``: the registry and one module per backend.

``registry`` resolves ``log_with`` (names, ``"all"``, custom trackers) and builds the trackers;
``base`` holds ``GeneralTracker``, Accelerate's tracker interface; ``tensorboard``, ``wandb``,
``mlflow``, ``aim``, ``comet_ml``, ``clearml``, ``dvclive``, ``swanlab`` and ``trackio`` are the
built-in backends, each importing its package only when built. The
``Accelerator``'s tracking methods are in ``accelerator.tracking``.

The names below load on first use, so ``import x_runtime`` does not import the registry or the
backends' modules (a run that logs nothing never does).
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module defining it, imported on first use (backends load only when asked).
_HOMES = {
    "LOGGER_TYPE_TO_CLASS": "registry",
    "AimTracker": "aim",
    "ClearMLTracker": "clearml",
    "CometMLTracker": "comet_ml",
    "DVCLiveTracker": "dvclive",
    "GeneralTracker": "base",
    "LoggerType": "registry",
    "MLflowTracker": "mlflow",
    "SwanLabTracker": "swanlab",
    "TensorBoardTracker": "tensorboard",
    "TrackerSpec": "registry",
    "TrackioTracker": "trackio",
    "WandBTracker": "wandb",
    "available_trackers": "registry",
    "build_trackers": "registry",
    "filter_trackers": "registry",
    "register_tracker_class": "registry",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
