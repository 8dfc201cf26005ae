"""The launcher contract as one frozen snapshot: read once, then handed down.

``x-launch`` (or torchrun, SLURM, ``accelerate launch``) describes the run in environment
variables (``x_common.env`` declares every one). The runtime reads them here and nowhere else:
the ``Accelerator`` takes one ``Settings`` when it is built and hands it to what it builds (the
strategy decision, the process state, precision, the plugins it makes, the watchdog's record).
A module that needs a launch setting takes it from the snapshot it was given; a test scans the
package for any other read of ``os.environ`` (``integration-tests/test_architecture.py``).

Plugins a script builds before its ``Accelerator`` (``FullyShardedDataParallelPlugin()``,
``TorchDynamoPlugin()``, ``ParallelismConfig()``) fill their unset fields from the variables at
construction, as Accelerate's do: they take ``current_settings()``, the snapshot of the
accelerator being built, or a fresh one when none is.

Examples:
    >>> from x_common import env
    >>> settings = Settings.of({env.MIXED_PRECISION.name: "bf16"})
    >>> settings.get(env.MIXED_PRECISION), settings.get(env.GRADIENT_ACCUMULATION_STEPS)
    ('bf16', 1)
    >>> settings.is_set(env.USE_CPU)
    False
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from x_common.env_var import EnvVar

__all__ = ["Settings", "building", "current_settings"]


@dataclass(frozen=True)
class Settings:
    """The environment this process was started with, as it was when the snapshot was taken."""

    environ: Mapping[str, str]

    @classmethod
    def read(cls) -> Settings:
        """Take the snapshot: the one read of ``os.environ`` in the runtime."""
        return cls.of(os.environ)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> Settings:
        """A snapshot of ``environ`` (a copy: later changes to it are not seen)."""
        return cls(MappingProxyType(dict(environ)))

    def get(self, var: EnvVar) -> Any:
        """``var``'s typed value in the snapshot (Accelerate's spelling when no ``X_*`` is set), or its default."""
        return var.read(self.environ)

    def is_set(self, var: EnvVar) -> bool:
        return var.is_set(self.environ)

    def raw(self, name: str, default: Any = None) -> Any:
        """A variable the contract does not declare (another library's own, e.g. ``MLFLOW_RUN_ID``)."""
        return self.environ.get(name, default)


_BUILDING: ContextVar[Settings | None] = ContextVar("x_runtime_settings", default=None)


@contextmanager
def building(settings: Settings) -> Iterator[Settings]:
    """Within the block, ``current_settings()`` is ``settings`` (an ``Accelerator`` being built)."""
    token = _BUILDING.set(settings)
    try:
        yield settings
    finally:
        _BUILDING.reset(token)


def current_settings() -> Settings:
    """The snapshot of the accelerator being built, or a fresh one (a plugin built by the script)."""
    return _BUILDING.get() or Settings.read()
