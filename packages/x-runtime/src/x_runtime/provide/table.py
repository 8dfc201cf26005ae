"""One served ``accelerate.*`` module as a table: each name it serves, and the x object behind it.

A table is written out name by name (``tables/``), and tested name by name against the real
Accelerate's module of the same name: every served name exists there, with the same kind of object.
A name the real module has and the table does not serve raises an ``ImportError`` that names x
and the name; there is no stand-in.

Examples:
    >>> table = ModuleTable("accelerate.logging", x_runtime="get_logger MultiProcessAdapter")
    >>> table.home("get_logger")
    Home(module='x_runtime', attr='get_logger')
    >>> table.home("missing") is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

__all__ = ["Home", "ModuleTable"]

# The distribution holding each x package a table may name, for the "pip install" in an error.
DISTRIBUTIONS = {"x_runtime": "x-runtime", "x_bigmodel": "x-bigmodel", "x_launch": "x-launch", "x_common": "x-common"}


@dataclass(frozen=True)
class Home:
    """Where a served name lives in x: a module and an attribute of it.

    The module is the one x's own code reads the name from, so an assignment on the served module
    (``accelerate.big_modeling.check_device_map = f``, as transformers does) reaches x's code.
    """

    module: str
    attr: str

    @property
    def distribution(self) -> str:
        return DISTRIBUTIONS[self.module.split(".")[0]]


@dataclass(frozen=True)
class ModuleTable:
    """The names one ``accelerate.*`` module serves.

    Attributes:
        name: the served module, e.g. ``accelerate.utils``.
        x_runtime, x_bigmodel, x_launch: names served under the same name from that package's top
            level, space-separated.
        elsewhere: names served from another module of x, or under another name, as
            ``{"name": "module:attribute"}``.
        package: whether the real module is a package (it has submodules).
    """

    name: str
    x_runtime: str = ""
    x_bigmodel: str = ""
    x_launch: str = ""
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    package: bool = False

    @cached_property
    def homes(self) -> Mapping[str, Home]:
        """Every served name and its home, in the table's order."""
        homes: dict[str, Home] = {}
        for package in ("x_runtime", "x_bigmodel", "x_launch"):
            for name in getattr(self, package).split():
                if name in homes:
                    raise ValueError(f"{self.name}: {name} is served twice")
                homes[name] = Home(package, name)
        for name, where in self.elsewhere.items():
            if name in homes:
                raise ValueError(f"{self.name}: {name} is served twice")
            module, _, attr = where.partition(":")
            homes[name] = Home(module, attr or name)
        return MappingProxyType(homes)

    def home(self, name: str) -> Home | None:
        return self.homes.get(name)
