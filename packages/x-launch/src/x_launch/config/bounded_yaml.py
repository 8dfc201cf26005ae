"""A config file's bytes to Python values, within bounds whatever the bytes are.

A launch config is a few dozen ``key: value`` pairs, so a file far bigger is refused before it
costs time or memory: its size, its nesting, and the number of values it holds once its aliases
are expanded. Aliases are counted while the file is composed, because a 500-byte file of nested
aliases (a "billion laughs") loads quickly into shared lists that expand to 10^9 values, and
whatever prints or walks them afterwards hangs. A key given twice is refused: PyYAML would keep
the last one silently.

Accelerate reads the same files with ``yaml.safe_load``; what real files use (JSON, a few
anchors and aliases, ``<<`` merges, a UTF-8 byte-order mark) loads the same here.
"""

from __future__ import annotations

import codecs
import functools
from dataclasses import dataclass, field
from typing import Any

from x_launch.config.value_preview import preview

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_VALUES", "Document", "YamlProblem", "decode", "parse"]

# Accelerate's own files are under 1 KiB, hold under 100 values and nest 3 deep (a list in a
# section). The bounds leave room for comments and hand-written lists, and keep the worst file
# within them at a small fraction of a second with PyYAML's pure-Python parser.
MAX_BYTES = 64 * 1024
MAX_VALUES = 2_000
MAX_DEPTH = 16

# Fixes for PyYAML's problems, found by a piece of their text.
_HINTS = (
    ("'\\t'", "indent with spaces, not tabs"),
    ("expected a single document", "keep one document: remove the second '---'"),
    ("found undefined alias", "define the anchor (&name) before the alias (*name)"),
    ("found duplicate anchor", "give each anchor (&name) its own name"),
    ("could not determine a constructor", "remove the tag: a launch config holds plain values"),
    ("found unhashable key", "a key must be a plain name"),
    ("mapping values are not allowed", "check the indentation, and quote a value that holds ': '"),
)


class YamlProblem(Exception):
    """What is wrong with a config file's bytes, and where.

    Attributes:
        what: the problem and its fix, one line without the file's name.
        line: 1-based, when the problem has a place.
        column: 1-based, when known.
        reading: the bytes are not text at all (rather than text that is not valid YAML).
    """

    def __init__(self, what: str, line: int | None = None, column: int | None = None, *, reading: bool = False):
        super().__init__(what)
        self.what, self.line, self.column, self.reading = what, line, column, reading

    def where(self) -> str:
        """``line 3, column 5: ``, or nothing when the problem has no place."""
        if self.line is None:
            return ""
        return f"line {self.line}, column {self.column}: " if self.column else f"line {self.line}: "


@dataclass
class Document:
    """A parsed file: ``data`` is None when it holds nothing (empty, blank, comments, ``---``)."""

    data: Any
    spots: dict[str, tuple[int, int]] = field(default_factory=dict)  # {key or "section.key": (line, column)}


def decode(raw: bytes) -> str:
    """The text of a config file, which must be UTF-8 (as Accelerate reads it).

    Raises:
        YamlProblem: ``reading``: UTF-16, binary data or bytes that are not UTF-8.
    """
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # UTF-32's marks start the same
        raise YamlProblem("it is UTF-16 (or UTF-32) text; save it as UTF-8", reading=True)
    nul = raw.find(b"\0")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise YamlProblem(
            f"it holds binary data (a NUL byte on line {line}), not YAML text; give the path of a launch config",
            reading=True,
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - raw.rfind(b"\n", 0, exc.start)
        byte = raw[exc.start]
        raise YamlProblem(
            f"byte 0x{byte:02x} is not UTF-8 text; save the file as UTF-8", line, column, reading=True
        ) from None


def parse(text: str) -> Document:
    """The file's values, and where each key is, for errors that point at the line.

    Raises:
        YamlProblem: malformed YAML, a key given twice, more than ``MAX_VALUES`` values (aliases
            expanded), nesting deeper than ``MAX_DEPTH``, or a value its tag cannot hold.
    """
    import yaml

    loader = None
    try:
        loader = _loader_class()(text)  # PyYAML checks every character here
        root = loader.get_single_node()
        data = None if root is None else loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise _problem(exc, text) from None
    finally:
        if loader is not None:
            loader.dispose()
    return Document(data, _spots(root) if isinstance(data, dict) else {})


def _problem(exc: Exception, text: str) -> YamlProblem:
    import yaml

    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        return YamlProblem(f"character #x{exc.character:04x} is not allowed in YAML; remove it", line, column)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = str(getattr(exc, "problem", None) or str(exc).splitlines()[0])
    context, first = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    # Two problems that PyYAML words as a context (the first place) and a problem (the second).
    if problem == "second occurrence" and context and first is not None:
        problem = f"{context.removesuffix('; first occurrence')} (first on line {first.line + 1})"
    elif problem == "but found another document" and context:
        problem = f"{context}, {problem}"
    if len(problem) > 200:  # PyYAML quotes anchors and tags, which may be as long as the file
        problem = problem[:200] + "..."
    hint = next((fix for clue, fix in _HINTS if clue in problem), None)
    what = f"{problem}; {hint}" if hint else problem
    if mark is None:
        return YamlProblem(what)
    return YamlProblem(what, mark.line + 1, mark.column + 1)


def _spots(root: Any) -> dict[str, tuple[int, int]]:
    import yaml

    spots: dict[str, tuple[int, int]] = {}
    for key_node, value_node in root.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        key = key_node.value
        spots[key] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        if isinstance(value_node, yaml.MappingNode):
            for sub_node, _ in value_node.value:
                if isinstance(sub_node, yaml.ScalarNode):
                    spots[f"{key}.{sub_node.value}"] = (sub_node.start_mark.line + 1, sub_node.start_mark.column + 1)
    return spots


def _unreadable(node: Any, exc: Exception) -> str:
    """Why a scalar that looks like a number or a date is neither (``2024-13-45``, 5,000 digits)."""
    shown = preview(node.value) if isinstance(node.value, str) else "this value"
    kind = {"timestamp": "date", "int": "integer"}.get(node.tag.rpartition(":")[2], node.tag.rpartition(":")[2])
    if kind == "integer" and "digits" in str(exc):
        return f"an integer of {len(node.value)} digits is too long; a launch setting is a small number"
    reason = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
    return f"{shown} is not a valid {kind} ({reason}); quote it if it is text"


@functools.cache
def _loader_class() -> type:
    import yaml
    from yaml.composer import ComposerError
    from yaml.constructor import ConstructorError

    class BoundedLoader(yaml.SafeLoader):
        """SafeLoader that counts values as it composes them, and refuses a key given twice."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.values = 0  # nodes so far, each alias counted as the values it stands for
            self.depth = 0
            self.aliased = False
            self.sizes: dict[int, int] = {}  # id(anchored node): its values, aliases expanded

        def _count(self, more: int, mark: Any) -> None:
            self.values += more
            if self.values > MAX_VALUES:
                if self.aliased:
                    what = (
                        f"its aliases (*name) expand to more than {MAX_VALUES} values, far more than a "
                        "launch config holds; write the values out instead of nesting aliases"
                    )
                else:
                    what = (
                        f"it holds more than {MAX_VALUES} values, far more than a launch config; is it the right file?"
                    )
                raise ComposerError(None, None, what, mark)

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                node = super().compose_node(parent, index)
                size = self.sizes.get(id(node))
                if size is None:  # its anchor is still open: the value would contain itself
                    raise ComposerError(
                        None,
                        None,
                        f"alias *{event.anchor} is inside the value it names, so it never ends; remove it",
                        event.start_mark,  # type: ignore[arg-type]  # the stubs' two Mark classes; PyYAML's pure loader makes error.Mark
                    )
                self.aliased = True
                self._count(size, event.start_mark)
                return node
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ComposerError(
                    None,
                    None,
                    f"values nest more than {MAX_DEPTH} levels deep; a launch config nests 2 or 3",
                    event.start_mark,
                )
            before = self.values
            self._count(1, event.start_mark)
            node = super().compose_node(parent, index)
            self.depth -= 1
            if event.anchor is not None:
                self.sizes[id(node)] = self.values - before
            return node

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep=deep)
            except (ValueError, OverflowError, TypeError) as exc:  # PyYAML's own converters raise these
                raise ConstructorError(None, None, _unreadable(node, exc), node.start_mark) from None

        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, merged by super()
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    hash(key)
                except TypeError:
                    break  # super() refuses it, with its place
                if key in seen:
                    raise ConstructorError(
                        None,
                        None,
                        f"key {preview(key)} is given twice (first on line {seen[key]}); keep one",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return BoundedLoader
