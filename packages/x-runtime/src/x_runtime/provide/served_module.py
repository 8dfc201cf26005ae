"""The module objects ``import accelerate...`` returns while x serves it, and their loader.

A served module holds no copies: each attribute is read from its home in x when asked for, so
the served module and x always agree, and an assignment on the served module is made on the home
module (transformers swaps ``accelerate.big_modeling.check_device_map`` for a no-op while it
dispatches some models; x's dispatch then calls the no-op). A name the real module has but x
does not serve raises ``ImportError`` from ``from accelerate.X import name`` and
``AttributeError`` from ``accelerate.X.name`` (so ``hasattr`` stays a question), both naming x.
"""

from __future__ import annotations

import dis
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Mapping
from typing import Any

from x_common.accelerate_import import ACCELERATE_API, runtime_version
from x_common.env import PROVIDE_ACCELERATE
from x_runtime.provide.table import Home, ModuleTable

__all__ = ["NotServedError", "ServedLoader", "ServedModule", "not_served_message", "served_line"]

_IMPORT_FROM = dis.opmap["IMPORT_FROM"]
DOCS = "https://github.com/x-project/x/blob/main/docs/ecosystem.md"


class NotServedError(ImportError):
    """``from accelerate.X import name`` where x serves ``accelerate.X`` but not ``name``."""


def not_served_message(module: str, name: str) -> str:
    """The one line a name x lacks gets.

    Examples:
        >>> not_served_message("accelerate.utils", "MegatronLMPlugin")  # doctest: +ELLIPSIS
        "x-runtime ... serves accelerate (1.15.0's API) but has no accelerate.utils.MegatronLMPlugin; ..."
    """
    return (
        f"x-runtime {runtime_version()} serves accelerate ({ACCELERATE_API}'s API) but has no {module}.{name}; "
        f"what x leaves out and why: {DOCS}. To use the real Accelerate instead, unset {PROVIDE_ACCELERATE.name} "
        "(or drop --provide-accelerate / provide_accelerate())"
    )


def served_line() -> str:
    """What rank 0 prints once when ``accelerate`` is first imported while x serves it."""
    try:
        real = _real_accelerate_version()
    except Exception:  # a line of information must never stop an import
        real = None
    beside = f"; the real Accelerate {real} installed here is not used" if real else ""
    return (
        f"x-runtime: accelerate is served by x-runtime {runtime_version()} (Accelerate {ACCELERATE_API}'s API){beside}"
    )


def _real_accelerate_version() -> str | None:
    """The version of a real Accelerate installed in site-packages, read from its files only."""
    for dist in importlib.metadata.MetadataPathFinder.find_distributions(
        importlib.metadata.DistributionFinder.Context(name="accelerate", path=list(sys.path))
    ):
        return str(dist.version)
    return None


def _called_by_from_import(depth: int = 2) -> bool:
    """Whether the frame ``depth`` levels up is running ``from module import name``."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _IMPORT_FROM


class ServedModule(types.ModuleType):
    """One ``accelerate.*`` module, each attribute read from x when asked for."""

    __table: ModuleTable

    def __init__(self, table: ModuleTable, submodules: Mapping[str, ModuleTable]) -> None:
        super().__init__(table.name)
        object.__setattr__(self, "_ServedModule__table", table)
        object.__setattr__(self, "_ServedModule__submodules", submodules)
        if table.package:
            object.__setattr__(self, "__path__", [])
        # `from accelerate.utils import *` takes what the installed x packages serve (x-bigmodel may be absent).
        present = {home.module.split(".")[0] for home in table.homes.values()}
        present = {top for top in present if importlib.util.find_spec(top) is not None}
        names = [n for n, home in table.homes.items() if not n.startswith("_") and home.module.split(".")[0] in present]
        object.__setattr__(self, "__all__", names)

    def __getattr__(self, name: str) -> Any:
        table: ModuleTable = object.__getattribute__(self, "_ServedModule__table")
        home = table.home(name)
        if home is not None:
            return getattr(_home_module(table.name, name, home), home.attr)
        submodules: Mapping[str, ModuleTable] = object.__getattribute__(self, "_ServedModule__submodules")
        if f"{table.name}.{name}" in submodules:  # `import accelerate` then `accelerate.utils.x`
            return importlib.import_module(f"{table.name}.{name}")
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # probes such as __file__, __wrapped__: not a missing API
        message = not_served_message(table.name, name)
        if _called_by_from_import():
            raise NotServedError(message, name=table.name)
        raise AttributeError(message)

    def __setattr__(self, name: str, value: Any) -> None:
        table: ModuleTable = object.__getattribute__(self, "_ServedModule__table")
        home = table.home(name)
        if home is None:
            super().__setattr__(name, value)
        else:
            setattr(_home_module(table.name, name, home), home.attr, value)

    def __dir__(self) -> list[str]:
        table: ModuleTable = object.__getattribute__(self, "_ServedModule__table")
        return sorted({*table.homes, *vars(self)})

    def __repr__(self) -> str:
        return f"<module {self.__name__!r} (served by x-runtime {runtime_version()})>"


def _home_module(served: str, name: str, home: Home) -> types.ModuleType:
    try:
        return importlib.import_module(home.module)
    except ModuleNotFoundError as exc:
        if exc.name != home.module.split(".")[0]:
            raise
        raise ModuleNotFoundError(
            f"{served}.{name} is served by {home.distribution}, which is not installed here: "
            f"pip install {home.distribution}",
            name=home.module,
        ) from None


class ServedLoader(importlib.abc.Loader):
    """Makes the ``ServedModule`` for a spec; the top module prints ``served_line()`` once, on rank 0."""

    def __init__(self, table: ModuleTable, submodules: Mapping[str, ModuleTable], announce: bool) -> None:
        self.table = table
        self.submodules = submodules
        self.announce = announce

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return ServedModule(self.table, self.submodules)

    def exec_module(self, module: types.ModuleType) -> None:
        if self.table.name == "accelerate":
            object.__setattr__(module, "__version__", ACCELERATE_API)
            if self.announce:
                print(served_line(), file=sys.stderr, flush=True)
