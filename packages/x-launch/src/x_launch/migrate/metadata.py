"""The PEP 723 ``# /// script`` block of a migrated script: ``accelerate`` becomes x's distributions.

A script run by ``uv run`` or ``pipx run`` declares what it needs in comments::

    # /// script
    # dependencies = ["accelerate>=1.0", "torch"]
    # ///

After migrate its imports come from x, so the ``accelerate`` requirement (any spelling, extras,
version or marker) is replaced by the x distributions the migrated script imports (``x-runtime``,
``x-bigmodel``, ``x-launch``). Its version is dropped (x's versions are its own); its marker is
kept; the ``deepspeed`` extra, the one Accelerate extra x-runtime also has, carries over.
``accelerate`` stays as well while some import still comes from it (a name x lacks). A script
importing nothing from x keeps its block as it was.

Only the requirement strings are replaced, in place: other entries, comments, quoting and the
one-per-line or inline layout stay. When ``tomllib`` is there (Python 3.11+), the block is
rewritten only if the strings found are exactly the ``dependencies`` it parses, and the result
must parse to the list intended; otherwise the block is left alone.

Examples:
    >>> text = '# /// script\\n# dependencies = ["accelerate>=1.0", "torch"]\\n# ///\\n'
    >>> print(rewrite_script_metadata(text, {"x_runtime"}), end="")
    # /// script
    # dependencies = ["x-runtime", "torch"]
    # ///
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["imported_modules", "rewrite_script_metadata"]

# PEP 723's own regular expression for a metadata block.
_BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_DEPENDENCIES = re.compile(r"(?m)^[ \t]*(dependencies|\"dependencies\"|'dependencies')[ \t]*=[ \t]*\[")
# PEP 508: name, optional [extras], then the version / URL and an optional "; marker".
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[([^\]]*)\])?([^;]*)(?:;(.*))?$")
# Import name -> distribution, in the order the block lists them.
_DISTRIBUTIONS = {"x_runtime": "x-runtime", "x_bigmodel": "x-bigmodel", "x_launch": "x-launch"}
_RUNTIME_EXTRAS = ("deepspeed",)  # Accelerate's extras x-runtime defines under the same name


def imported_modules(source: str) -> set[str]:
    """The top-level modules ``source`` imports (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def rewrite_script_metadata(source: str, imported: Iterable[str]) -> str:
    """``source`` with ``accelerate`` in its ``# /// script`` dependencies replaced (see module)."""
    imported = set(imported)
    x_dists = [dist for module, dist in _DISTRIBUTIONS.items() if module in imported]
    blocks = [m for m in _BLOCK.finditer(source) if m.group("type") == "script"]
    if not x_dists or len(blocks) != 1:  # PEP 723: two script blocks are an error; not ours to fix
        return source
    block = blocks[0]
    content_lines = block.group("content").splitlines(keepends=True)
    content = "".join(line[2:] if line.startswith("# ") else line[1:] for line in content_lines)
    new_content = _rewrite_content(content, x_dists, keep_accelerate="accelerate" in imported)
    if new_content is None:
        return source
    commented = "".join(f"# {line}" if line.strip("\r\n") else f"#{line}" for line in new_content.splitlines(True))
    start, end = block.span("content")
    return source[:start] + commented + source[end:]


def _rewrite_content(content: str, x_dists: list[str], keep_accelerate: bool) -> str | None:
    """The TOML ``content`` with its accelerate requirement(s) replaced, or None to leave it."""
    match = _DEPENDENCIES.search(content)
    strings = _array_strings(content, match.end()) if match else None
    if strings is None:
        return None
    values = [value for _, _, _, value in strings]
    expected = _parsed_dependencies(content)
    if expected is not None and expected != values:
        return None  # our reading of the array is not TOML's: change nothing
    emitted = {(_name(v), "") for v in values if _name(v) != "accelerate"}  # already listed: not twice
    replaced = []  # (index in the array, string's span, quote, what replaces it)
    for index, (start, end, quote, value) in enumerate(strings):
        if _name(value) == "accelerate":
            entries = _replacement(value, x_dists, keep_accelerate, emitted)
            if entries != [value]:
                replaced.append((index, start, end, quote, entries))
    result, new_values = content, list(values)
    for index, start, end, quote, entries in reversed(replaced):
        start, end, text = _edit(result, start, end, [_quote(entry, quote) for entry in entries])
        result = result[:start] + text + result[end:]
        new_values[index : index + 1] = entries
    if result == content:
        return None
    if expected is not None and _parsed_dependencies(result) != new_values:
        return None  # never write a block that does not parse to what was meant
    return result


def _edit(text: str, start: int, end: int, literals: list[str]) -> tuple[int, int, str]:
    """The span to replace and its text: the string ``text[start:end]`` becomes ``literals``.

    One requirement per line stays one per line at the same indentation, inline stays inline; no
    literals (the distributions were listed already): the string goes with its line or comma.
    """
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    indent = text[line_start:start]
    one_per_line = not indent.strip() and text[end:line_end].strip().lstrip(",").strip()[:1] in ("", "#")
    if literals:
        return start, end, (",\n" + indent if one_per_line else ", ").join(literals)
    if one_per_line:
        return line_start, min(line_end + 1, len(text)), ""
    follow = re.match(r"\s*,[ \t]*", text[end:])
    if follow:  # the comma after it goes too
        return start, end + follow.end(), ""
    return len(text[:start].rstrip().rstrip(",").rstrip()), end, ""  # the last one: the comma before


def _replacement(value: str, x_dists: list[str], keep_accelerate: bool, emitted: set[tuple[str, str]]) -> list[str]:
    """What replaces the accelerate requirement ``value``: x's distributions not listed yet, after
    ``value`` itself while the script still imports from Accelerate."""
    match = _REQUIREMENT.match(value)
    if match is None:
        return [value]
    extras = [e.strip() for e in (match.group(2) or "").split(",") if e.strip() in _RUNTIME_EXTRAS]
    marker = f"; {match.group(4).strip()}" if match.group(4) else ""
    entries = [value] if keep_accelerate else []
    for dist in x_dists:
        if (dist, "") in emitted or (dist, marker) in emitted:
            continue
        emitted.add((dist, marker))
        carried = f"[{','.join(extras)}]" if extras and dist == "x-runtime" else ""
        entries.append(f"{dist}{carried}{marker}")
    return entries


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement (PEP 503), "" when there is none."""
    match = _REQUIREMENT.match(requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def _quote(value: str, quote: str) -> str:
    if quote == "'" and "'" not in value:
        return f"'{value}'"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array_strings(text: str, pos: int) -> list[tuple[int, int, str, str]] | None:
    """(start, end, quote, value) of each string in the TOML array opened before ``pos``; None when
    it holds anything else (multi-line strings, nested arrays) or does not close."""
    found: list[tuple[int, int, str, str]] = []
    while pos < len(text):
        char = text[pos]
        if char in " \t\r\n,":
            pos += 1
        elif char == "#":
            newline = text.find("\n", pos)
            pos = len(text) if newline < 0 else newline
        elif char == "]":
            return found
        elif char == "'" and not text.startswith("'''", pos):
            end = text.find("'", pos + 1)
            if end < 0 or "\n" in text[pos:end]:
                return None
            found.append((pos, end + 1, "'", text[pos + 1 : end]))
            pos = end + 1
        elif char == '"' and not text.startswith('"""', pos):
            end = pos + 1
            while end < len(text) and text[end] not in '"\n':
                end += 2 if text[end] == "\\" else 1
            if end >= len(text) or text[end] != '"':
                return None
            try:
                value = json.loads(text[pos : end + 1])
            except ValueError:
                return None
            found.append((pos, end + 1, '"', value))
            pos = end + 1
        else:
            return None
    return None


def _parsed_dependencies(content: str) -> Any:
    """``dependencies`` as TOML reads ``content``; None when no TOML reader is there (Python 3.10:
    the rewrite then rests on the scanner alone)."""
    if sys.version_info >= (3, 11):
        import tomllib

        try:
            return tomllib.loads(content).get("dependencies")
        except tomllib.TOMLDecodeError:
            return ["<not TOML>"]  # matches no list of strings: the block is left alone
    return None
