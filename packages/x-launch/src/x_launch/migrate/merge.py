"""Merging the x imports ``x-launch migrate`` writes: one ``from x_runtime import ...`` per run.

Each ``from accelerate... import`` statement is rewritten on its own, so a script importing from
``accelerate``, ``accelerate.utils`` and ``accelerate.hooks`` would end with several
``from x_runtime import`` and ``from x_bigmodel import`` lines. Here the lines of one x module
within a *run* (sibling import statements of one block, nothing but other imports, blank lines and
comments between them) join the first of them; names already there are not repeated.

Only imports move, and only earlier within their run, so nothing runs between where a name was
bound and where it is now. A name is not moved past an import between the two that binds the same
name (the later binding would otherwise win), and ``*`` imports and statements sharing their line
with other code (``;``) are left where they are.

Examples:
    >>> import ast
    >>> tree = ast.parse("from accelerate import A\\nfrom accelerate.utils import B\\n")
    >>> first, second = tree.body
    >>> lines = {first: [FromLine("x_runtime", ["A"])], second: [FromLine("x_runtime", ["B", "A"])]}
    >>> merge_runs(tree, lines, alone=lambda node: True)
    >>> lines[first][0].text(), lines[second]
    ('from x_runtime import A, B', [])
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["X_MODULES", "FromLine", "Rewritten", "merge_runs"]

# The modules migrate writes imports from: only their lines merge (a name x lacks keeps its own).
X_MODULES = frozenset({"x_runtime", "x_bigmodel", "x_launch"})


@dataclass
class FromLine:
    """One ``from <module> import <names>`` line migrate writes; ``names`` as written (``a as b``)."""

    module: str
    names: list[str]

    def text(self) -> str:
        return f"from {self.module} import {', '.join(self.names)}"

    def bound(self) -> set[str]:
        """The names this line binds in the script."""
        return {name.split(" as ")[-1] for name in self.names}


# What a rewritten statement becomes: ``from`` lines, or ``import`` lines as text.
Rewritten = list[FromLine | str]


def merge_runs(tree: ast.AST, rewrites: dict[ast.stmt, Rewritten], alone: Callable[[ast.stmt], bool]) -> None:
    """Move the x ``from`` lines of each run in ``tree`` into the first line of their module.

    ``rewrites`` maps each rewritten statement to its new lines and is changed in place: a line
    merged away leaves its statement's list (an empty list: the statement goes). ``alone`` tells
    whether a statement has its lines to itself (no ``;``), the only ones that merge.
    """
    for body in _bodies(tree):
        targets: dict[str, FromLine] = {}  # x module -> the line later names join
        bound_since: dict[str, set[str]] = {}  # x module -> names bound after its target line
        for stmt in body:
            if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                targets.clear()  # code runs here: the run ends
                bound_since.clear()
                continue
            lines = rewrites.get(stmt)
            if lines is None or not alone(stmt):
                _note_bound(bound_since, _bound_by(stmt))
                if "*" in _bound_by(stmt):  # binds names no one can list: the run ends
                    targets.clear()
                    bound_since.clear()
                continue
            staying: Rewritten = []
            for line in lines:
                if not isinstance(line, FromLine) or line.module not in X_MODULES or "*" in line.names:
                    staying.append(line)
                    continue
                target = targets.get(line.module)
                if target is not None and not line.bound() & bound_since[line.module]:
                    target.names.extend(name for name in line.names if name not in target.names)
                    continue
                targets[line.module], bound_since[line.module] = line, set()
                staying.append(line)
            lines[:] = staying
            for line in staying:
                bound = line.bound() if isinstance(line, FromLine) else _bound_by_text(line)
                _note_bound({m: s for m, s in bound_since.items() if targets[m] is not line}, bound)
                if "*" in bound:  # as above: nothing moves past a star import
                    targets.clear()
                    bound_since.clear()


def _note_bound(bound_since: dict[str, set[str]], names: set[str]) -> None:
    for seen in bound_since.values():
        seen |= names


def _bodies(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every block of statements: the module, function and class bodies, branches, handlers."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _bound_by(stmt: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(stmt, ast.Import):
        return {alias.asname or alias.name.split(".")[0] for alias in stmt.names}
    return {alias.asname or alias.name for alias in stmt.names}


def _bound_by_text(line: str) -> set[str]:
    """Names an ``import a.b`` / ``import a as b`` line migrate wrote binds."""
    tree = ast.parse(line)
    return _bound_by(tree.body[0]) if isinstance(tree.body[0], (ast.Import, ast.ImportFrom)) else set()
