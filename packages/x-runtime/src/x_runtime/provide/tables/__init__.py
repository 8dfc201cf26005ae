"""Every served ``accelerate.*`` module, by name: the tables of ``top``, ``utils``, ``commands``, ``test_utils``.

A module of Accelerate's that is not here is not served: importing it raises
``ModuleNotFoundError`` naming x (``x_runtime.provide.find_spec``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from x_runtime.provide.table import ModuleTable
from x_runtime.provide.tables import commands, test_utils, top, utils

__all__ = ["SERVED"]


def _by_name(*groups: tuple[ModuleTable, ...]) -> Mapping[str, ModuleTable]:
    served: dict[str, ModuleTable] = {}
    for group in groups:
        for table in group:
            if table.name in served:
                raise ValueError(f"{table.name} has two tables")
            served[table.name] = table
    return MappingProxyType(served)


SERVED = _by_name(top.TABLES, utils.TABLES, commands.TABLES, test_utils.TABLES)
