"""Serving the ``accelerate`` import from x: the import-system half, which imports no torch.

transformers' ``Trainer``, TRL, PEFT and ``from_pretrained(device_map=...)`` import ``accelerate``
inside the libraries, where no import can be edited. When this finder is installed, ``import
accelerate`` and every ``accelerate.*`` module resolve to x's objects, and
``importlib.metadata.version("accelerate")`` answers the Accelerate API level x implements
(``ACCELERATE_API``), whether or not the real Accelerate is installed beside it. No distribution
named ``accelerate`` is built or installed (the name is its owners'): both answers come from one
object at the front of ``sys.meta_path``.

It is installed, opt-in, in three ways:

- ``X_PROVIDE_ACCELERATE=1`` in a process's environment: the ``x_common_accelerate.pth`` line that
  x-common installs calls ``install_from_environment()`` at interpreter start (plain ``python``,
  every torchrun or srun rank), as coverage's process start does;
- ``x-launch --provide-accelerate script.py`` sets that variable for every rank;
- ``x_runtime.provide_accelerate()``, called before transformers, TRL or PEFT is imported.

Which name comes from where is x-runtime's business (``x_runtime.provide``), imported when
``accelerate`` is first looked up, so the interpreter start stays as cheap as the environment check.

Examples:
    >>> import importlib.metadata, sys
    >>> finder = AccelerateFinder()
    >>> [d.version for d in finder.find_distributions(importlib.metadata.DistributionFinder.Context(name="accelerate"))]
    ['1.15.0']
    >>> list(finder.find_distributions(importlib.metadata.DistributionFinder.Context(name="torch")))
    []
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from x_common.env import PROVIDE_ACCELERATE

__all__ = [
    "ACCELERATE_API",
    "PROVIDER",
    "SERVED",
    "AccelerateFinder",
    "ServedDistribution",
    "install",
    "install_from_environment",
    "installed",
    "is_served",
    "runtime_version",
]

SERVED = "accelerate"
# The Accelerate release whose API the x packages implement and are tested against side by side.
ACCELERATE_API = "1.15.0"
# Where the served modules are built (imported on the first lookup of ``accelerate``).
PROVIDER = "x_runtime.provide"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_served(fullname: str) -> bool:
    """Whether ``fullname`` is ``accelerate`` or one of its modules.

    Examples:
        >>> is_served("accelerate.utils"), is_served("accelerated")
        (True, False)
    """
    return fullname == SERVED or fullname.startswith(SERVED + ".")


class ServedDistribution(importlib.metadata.Distribution):
    """The metadata ``importlib.metadata`` reads for ``accelerate`` while x serves it.

    Name ``accelerate``, version ``ACCELERATE_API``; its summary says it is x-runtime, so
    nobody mistakes it for the real package. It lists no files: nothing of it is on disk.
    """

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return (
                "Metadata-Version: 2.1\n"
                f"Name: {SERVED}\n"
                f"Version: {ACCELERATE_API}\n"
                f"Summary: served by x-runtime {runtime_version()} (Accelerate {ACCELERATE_API}'s API); "
                "not the real Accelerate\n"
            )
        if filename == "top_level.txt":
            return SERVED + "\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(__file__).parent / path


@functools.lru_cache(maxsize=1)
def runtime_version() -> str:
    """The installed x-runtime's version, read from its metadata (no import of x-runtime)."""
    try:
        return importlib.metadata.version("x-runtime")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


class AccelerateFinder(importlib.abc.MetaPathFinder):
    """Finds ``accelerate`` and its modules in x, and ``accelerate``'s distribution metadata."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not is_served(fullname):
            return None
        try:
            provider = importlib.import_module(PROVIDER)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("x_runtime"):
                raise
            raise ModuleNotFoundError(
                f"{fullname} is served by x-runtime here ({PROVIDE_ACCELERATE.name} is set), and x-runtime is "
                f"not installed: pip install x-runtime, or unset {PROVIDE_ACCELERATE.name}",
                name=fullname,
            ) from None
        spec: importlib.machinery.ModuleSpec = provider.find_spec(fullname)
        return spec

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        context = context if context is not None else importlib.metadata.DistributionFinder.Context()
        # pip (and other installers) ask one site-packages folder at a time: they must keep seeing
        # what is installed there, never this run-time answer.
        if context.path is not sys.path:
            return iter(())
        if context.name is not None and _normalized(context.name) != SERVED:
            return iter(())
        return iter((ServedDistribution(),))


def installed() -> bool:
    """Whether this process serves ``accelerate`` from x."""
    return any(isinstance(finder, AccelerateFinder) for finder in sys.meta_path)


def install() -> bool:
    """Put the finder at the front of ``sys.meta_path``; ``False`` when it was already there.

    It goes first so that it answers before the real Accelerate's files, when those are installed.
    """
    if installed():
        return False
    sys.meta_path.insert(0, AccelerateFinder())
    return True


def install_from_environment(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """``install()`` when ``X_PROVIDE_ACCELERATE`` is true; what the ``.pth`` line calls at start-up.

    A malformed value is one line on stderr and serves nothing (an interpreter start must not fail).
    """
    try:
        wanted = PROVIDE_ACCELERATE.read(os.environ if environ is None else environ)
    except ValueError as exc:
        if not _said:  # a venv's lib64 -> lib link makes site.py run the .pth line twice
            _said.append(str(exc))
            print(f"x-common: {exc}; accelerate is not served by x", file=sys.stderr)
        return False
    return bool(wanted) and install()


_said: list[str] = []
