"""Uses of Accelerate names that no longer exist, which ``x-launch migrate`` flags but leaves.

Migrate changes imports only; code that reads a name Accelerate 1.x removed fails on Accelerate
and on x alike, so each use gets a note in the form of the other notes (``file:line: what;
the fix``) instead of a silent rewrite of the user's logic.

``DistributedType.TPU``: Accelerate renamed it ``XLA`` (and 1.0 removed the old name); x's
``DistributedType`` has ``XLA`` only. Found as an attribute ``TPU`` of ``DistributedType``,
whichever way it was imported (``from accelerate.utils import DistributedType as DT``,
``accelerate.DistributedType``, ``state.DistributedType``).

Examples:
    >>> [f.describe("train.py") for f in removed_names("if t == DistributedType.TPU:\\n    pass\\n")]
    ['train.py:1: DistributedType.TPU is gone (Accelerate 1.x and x name it XLA): use DistributedType.XLA']
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

__all__ = ["Flag", "removed_names"]

# Modules whose DistributedType lacks TPU: Accelerate's (before or after migrate) and x's.
_SOURCES = ("accelerate", "x_runtime")


@dataclass(frozen=True)
class Flag:
    """A use of a name Accelerate 1.x and x do not have; migrate leaves it and says what to write."""

    line: int
    message: str

    def describe(self, filename: str) -> str:
        return f"{filename}:{self.line}: {self.message}"


def removed_names(source: str) -> list[Flag]:
    """One ``Flag`` per use of ``DistributedType.TPU`` in ``source``, by line."""
    tree = ast.parse(source)
    names = {"DistributedType"} | _aliases(tree)
    flags = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr != "TPU":
            continue
        base = node.value
        if (isinstance(base, ast.Name) and base.id in names) or (
            isinstance(base, ast.Attribute) and base.attr == "DistributedType"
        ):
            flags.append(
                Flag(
                    node.lineno,
                    f"{ast.unparse(node)} is gone (Accelerate 1.x and x name it XLA): use {ast.unparse(base)}.XLA",
                )
            )
    return sorted(flags, key=lambda f: (f.line, f.message))


def _aliases(tree: ast.AST) -> set[str]:
    """Other names the script binds to ``DistributedType`` (``import DistributedType as DT``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _SOURCES:
            found |= {a.asname for a in node.names if a.name == "DistributedType" and a.asname}
    return found
