"""On-disk cache of model summaries, so a second estimate of the same config is instant.

The key covers everything the summary depends on: the config's content (not its path), the
library and its version, the flags that change which class is built, and x-estimate's version.
Models that run their own code (``--trust_remote_code``) are never cached: their code can
change while their config does not.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from x_common import env
from x_estimate.model.summary import ModelSummary

__all__ = ["cache_dir", "load_summary", "save_summary", "summary_key"]


def cache_dir() -> Path:
    base = env.XDG_CACHE_HOME.read()
    return (Path(base) if base else Path.home() / ".cache") / "x-estimate"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def summary_key(*, library: str, config: dict[str, Any] | None, timm_name: str | None, base_model: bool) -> str:
    """Hex digest naming one summary."""
    material = {
        # The distribution's version is _version.py's (test_cli checks they agree); read like the
        # libraries', since a module in a folder imports no private module of the package's top level.
        "x-estimate": _version("x-estimate"),
        "library": library,
        "library_version": _version(library),
        "torch": _version("torch"),
        "config": config,
        "timm_name": timm_name,
        "base_model": base_model,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def load_summary(key: str) -> ModelSummary | None:
    """The cached summary, or None when absent, unreadable or from another format."""
    try:
        return ModelSummary.from_json((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_summary(key: str, summary: ModelSummary) -> None:
    """Store atomically; a cache that cannot be written is skipped, never an error."""
    directory = cache_dir()
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(summary.to_json())
            os.replace(tmp, directory / f"{key}.json")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
