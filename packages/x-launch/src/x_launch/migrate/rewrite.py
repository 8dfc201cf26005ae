"""``x-launch migrate FILE...``: rewrite a script's imports from Accelerate to x.

The rule: a name imported from ``accelerate`` or any ``accelerate.<module>`` comes from the x
package that exports it: ``x_bigmodel`` (the big-model names and the hooks), ``x_runtime``
(everything else x has), ``x_launch`` (``accelerate.commands.*``). Which package exports what is
``x_launch.migrate.x_names`` (checked against the packages themselves), so every import migrate writes
imports. A name x does not have keeps its import from Accelerate, and ``migrate_file`` says so in
one line per name. ``import accelerate`` becomes ``import x_runtime as accelerate``; ``import
accelerate.hooks as h`` becomes ``import x_bigmodel as h``.

Only the source span of each import statement is replaced (found with ``ast``), so comments,
blank lines and formatting elsewhere stay as they were. x-runtime need not be installed. Three
helpers finish the job: ``x_launch.migrate.merge`` joins the lines of one x module within a run of imports
(``from accelerate import A`` and ``from accelerate.utils import B`` become one ``from x_runtime
import A, B``), ``x_launch.migrate.metadata`` turns ``accelerate`` in a PEP 723 ``# /// script`` block into
the x distributions the script now imports, and ``x_launch.migrate.flags`` finds uses of names Accelerate
1.x removed (``DistributedType.TPU``), which ``migrate_file`` reports beside the kept names.

Examples:
    >>> print(migrate_source("from accelerate import Accelerator, init_empty_weights  # setup\\n"), end="")
    from x_runtime import Accelerator
    from x_bigmodel import init_empty_weights  # setup
"""

from __future__ import annotations

import ast
import difflib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from x_launch.migrate import x_names
from x_launch.migrate.flags import Flag, removed_names
from x_launch.migrate.merge import FromLine, Rewritten, merge_runs
from x_launch.migrate.metadata import imported_modules, rewrite_script_metadata

__all__ = ["Kept", "MigrateError", "migrate_file", "migrate_source", "migrate_with_notes"]

# Modules whose names, imported whole, are x-bigmodel's (``import accelerate.hooks as hooks``).
_BIG_MODEL_MODULES = ("accelerate.hooks", "accelerate.big_modeling")


class MigrateError(ValueError):
    """A file that cannot be migrated (it does not parse, or cannot be read); one line."""


@dataclass(frozen=True)
class Kept:
    """An Accelerate name x does not have: its import was left as it was."""

    line: int
    module: str
    name: str

    def describe(self, filename: str) -> str:
        return f"{filename}:{self.line}: x has no {self.module}.{self.name}; its import from Accelerate stays"


def _is_accelerate(module: str | None) -> bool:
    return module == "accelerate" or (module or "").startswith("accelerate.")


def _target(module: str, name: str) -> str | None:
    """The x package exporting ``name`` (imported from ``module``), or None when x has no such name."""
    if name == "*":
        return "x_bigmodel" if module in _BIG_MODEL_MODULES else "x_runtime"
    if module.startswith("accelerate.commands"):
        return "x_launch" if name in x_names.LAUNCH else None
    if name in x_names.BIGMODEL:
        return "x_bigmodel"
    return "x_runtime" if name in x_names.RUNTIME else None


def _module_target(module: str) -> str:
    """What ``import <module> as name`` becomes: the x package holding that module's names."""
    if module.startswith("accelerate.commands"):
        return "x_launch"
    return "x_bigmodel" if module in _BIG_MODEL_MODULES else "x_runtime"


def _alias(alias: ast.alias) -> str:
    return alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"


def _rewrite(node: ast.Import | ast.ImportFrom, kept: list[Kept]) -> Rewritten | None:
    """The lines replacing ``node`` (without indentation), or ``None`` to keep it."""
    if isinstance(node, ast.ImportFrom):
        if node.level or not _is_accelerate(node.module):
            return None
        module = str(node.module)
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            target = _target(module, alias.name)
            if target is None:
                kept.append(Kept(node.lineno, module, alias.name))
            groups.setdefault(target or module, []).append(_alias(alias))
        if list(groups) == [module]:
            return None  # nothing x has: the statement stays as written
        return [FromLine(target, names) for target, names in groups.items()]
    if not any(_is_accelerate(alias.name) for alias in node.names):
        return None
    lines: Rewritten = []
    for alias in node.names:
        if not _is_accelerate(alias.name):
            lines.append(f"import {_alias(alias)}")
        elif alias.asname is not None:
            lines.append(f"import {_module_target(alias.name)} as {alias.asname}")
        else:  # `import accelerate.utils` binds `accelerate`
            lines.append(f"import {_module_target(alias.name)} as accelerate")
    return lines


def migrate_source(source: str, filename: str = "<source>") -> str:
    """``source`` with its Accelerate imports rewritten; unchanged text elsewhere.

    Raises:
        MigrateError: ``source`` does not parse.
    """
    return migrate_with_notes(source, filename)[0]


def migrate_with_notes(source: str, filename: str = "<source>") -> tuple[str, list[Kept]]:
    """``migrate_source``'s text, and the Accelerate names left imported from Accelerate (x has none).

    Raises:
        MigrateError: ``source`` does not parse.
    """
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        raise MigrateError(f"{filename}:{exc.lineno}: does not parse: {exc.msg}") from None
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode("utf-8")))
    data = source.encode("utf-8")
    kept: list[Kept] = []
    rewrites: dict[ast.stmt, Rewritten] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            new = _rewrite(node, kept)
            if new is not None:
                rewrites[node] = new

    def span(node: ast.stmt) -> tuple[int, int]:
        start = offsets[node.lineno - 1] + node.col_offset
        return start, offsets[int(node.end_lineno or node.lineno) - 1] + int(node.end_col_offset or 0)

    def alone(node: ast.stmt) -> bool:  # nothing but indentation before it, no code after it
        start, end = span(node)
        return not data[offsets[node.lineno - 1] : start].strip() and not _after_on_line(data, end)

    merge_runs(tree, rewrites, alone)
    edits: list[tuple[int, int, bytes]] = []
    for node, new in rewrites.items():
        start, end = span(node)
        if not new:  # every line joined an earlier one: the statement goes, a comment on it stays
            edits.append(_removal(data, offsets[node.lineno - 1], end, " " * node.col_offset))
            continue
        texts = [line.text() if isinstance(line, FromLine) else line for line in new]
        indent = " " * node.col_offset
        text = texts[0] + "".join(f"\n{indent}{line}" for line in texts[1:])
        if "\n" in text and _after_on_line(data, end):
            text = "; ".join(texts)  # more code after it on the line: keep one line
        edits.append((start, end, text.encode("utf-8")))
    for start, end, replacement in sorted(edits, reverse=True):
        data = data[:start] + replacement + data[end:]
    migrated = data.decode("utf-8")
    if "# /// script" in migrated:  # parsing the result again only where a PEP 723 block may need it
        migrated = rewrite_script_metadata(migrated, imported_modules(migrated))
    return migrated, sorted(kept, key=lambda k: k.line)


def _removal(data: bytes, line_start: int, end: int, indent: str) -> tuple[int, int, bytes]:
    """The edit deleting the statement ending at ``end`` and its line; its comment keeps a line."""
    rest, newline, _ = data[end:].partition(b"\n")
    comment = rest.strip()
    stop = end + len(rest) + len(newline)
    return line_start, stop, (indent.encode() + comment + newline) if comment else b""


def _after_on_line(data: bytes, end: int) -> bool:
    """Whether code (not a comment) follows the statement on its last line."""
    rest = data[end:].split(b"\n", 1)[0].strip()
    return bool(rest) and not rest.startswith(b"#")


def _write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temporary file and a rename: never half-written."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def migrate_file(path: str | Path, *, write: bool = False) -> tuple[str, list[str]]:
    """The unified diff migrating ``path`` (empty when nothing changes) and one line per name left
    imported from Accelerate or used though Accelerate 1.x removed it (``DistributedType.TPU``);
    ``write``: also apply the diff.

    Raises:
        MigrateError: the file cannot be read or does not parse.
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8", newline="") as src:
            before = src.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise MigrateError(f"{path}: cannot read: {exc}") from None
    after, kept = migrate_with_notes(before, str(path))
    # Names Accelerate 1.x removed are flagged, not rewritten: with the kept names, by line.
    found: list[Kept | Flag] = [*kept, *removed_names(before)]
    notes = [note.describe(str(path)) for note in sorted(found, key=lambda note: note.line)]
    if after == before:
        return "", notes
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    if write:
        _write_atomically(path, after)
    return "".join(line if line.endswith("\n") else line + "\n" for line in diff), notes
