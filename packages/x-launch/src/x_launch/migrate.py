"""``x-launch migrate FILE...``: rewrite a script's imports from Accelerate to x.

The rule: every name imported from ``accelerate`` or any ``accelerate.<module>`` comes from
``x_runtime``, except the big-model names (``BIG_MODEL_NAMES``: ``init_empty_weights``,
``load_checkpoint_and_dispatch``, ``dispatch_model``, ... and every name of
``accelerate.hooks``), which come from ``x_bigmodel``, and the names of
``accelerate.commands.*``, which come from ``x_launch``. ``import accelerate`` becomes
``import x_runtime as accelerate``; ``import accelerate.utils as u`` becomes ``import
x_runtime as u``.

Only the source span of each import statement is replaced (found with ``ast``), so comments,
blank lines and formatting elsewhere stay as they were. x-runtime need not be installed.

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
from pathlib import Path

__all__ = ["BIG_MODEL_NAMES", "MigrateError", "migrate_file", "migrate_source"]

BIG_MODEL_NAMES = frozenset(
    {
        "init_empty_weights",
        "init_on_device",
        "infer_auto_device_map",
        "load_checkpoint_and_dispatch",
        "load_checkpoint_in_model",
        "dispatch_model",
        "cpu_offload",
        "cpu_offload_with_hook",
        "disk_offload",
        "get_balanced_memory",
        "get_max_memory",
        # accelerate.hooks
        "ModelHook",
        "SequentialHook",
        "AlignDevicesHook",
        "CpuOffload",
        "UserCpuOffloadHook",
        "LayerwiseCastingHook",
        "add_hook_to_module",
        "remove_hook_from_module",
        "remove_hook_from_submodules",
        "attach_align_device_hook",
        "attach_align_device_hook_on_blocks",
        "attach_execution_device_hook",
        "attach_layerwise_casting_hooks",
    }
)


class MigrateError(ValueError):
    """A file that cannot be migrated (it does not parse, or cannot be read); one line."""


def _is_accelerate(module: str | None) -> bool:
    return module == "accelerate" or (module or "").startswith("accelerate.")


def _target(module: str, name: str) -> str:
    if module.startswith("accelerate.commands"):
        return "x_launch"
    if module == "accelerate.hooks" or name in BIG_MODEL_NAMES:
        return "x_bigmodel"
    return "x_runtime"


def _alias(alias: ast.alias) -> str:
    return alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"


def _rewrite(node: ast.Import | ast.ImportFrom) -> list[str] | None:
    """The statements replacing ``node`` (without indentation), or ``None`` to keep it."""
    if isinstance(node, ast.ImportFrom):
        if node.level or not _is_accelerate(node.module):
            return None
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            groups.setdefault(_target(str(node.module), alias.name), []).append(_alias(alias))
        return [f"from {target} import {', '.join(names)}" for target, names in groups.items()]
    if not any(_is_accelerate(alias.name) for alias in node.names):
        return None
    lines = []
    for alias in node.names:
        if not _is_accelerate(alias.name):
            lines.append(f"import {_alias(alias)}")
        elif alias.asname is not None:
            lines.append(f"import {_target(alias.name, '')} as {alias.asname}")
        else:  # `import accelerate.utils` binds `accelerate`
            lines.append(f"import {_target(alias.name, '')} as accelerate")
    return lines


def migrate_source(source: str, filename: str = "<source>") -> str:
    """``source`` with its Accelerate imports rewritten; unchanged text elsewhere.

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
    edits: list[tuple[int, int, bytes]] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        new = _rewrite(node)
        if new is None:
            continue
        start = offsets[node.lineno - 1] + node.col_offset
        end = offsets[int(node.end_lineno or node.lineno) - 1] + int(node.end_col_offset or 0)
        indent = " " * node.col_offset
        text = new[0] + "".join(f"\n{indent}{line}" for line in new[1:])
        if "\n" in text and _after_on_line(data, end):
            text = "; ".join(new)  # more code after it on the line: keep one line
        edits.append((start, end, text.encode("utf-8")))
    for start, end, replacement in sorted(edits, reverse=True):
        data = data[:start] + replacement + data[end:]
    return data.decode("utf-8")


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


def migrate_file(path: str | Path, *, write: bool = False) -> str:
    """The unified diff migrating ``path`` (empty when nothing changes); ``write``: also apply it.

    Raises:
        MigrateError: the file cannot be read or does not parse.
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8", newline="") as src:
            before = src.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise MigrateError(f"{path}: cannot read: {exc}") from None
    after = migrate_source(before, str(path))
    if after == before:
        return ""
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    if write:
        _write_atomically(path, after)
    return "".join(line if line.endswith("\n") else line + "\n" for line in diff)
