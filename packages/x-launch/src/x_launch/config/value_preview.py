"""A value shown in an error message, in a bounded number of characters whatever it holds.

``repr()`` of a value read from a hostile file can take minutes and gigabytes (a list of lists
whose items are shared, as YAML aliases make them, prints as 10^9 items), or fail outright (an
integer of 5,000 digits); the preview walks only as far as its budget.

Examples:
    >>> preview("fp32")
    "'fp32'"
    >>> preview([1.0])
    '[1.0]'
    >>> preview(list(range(1000)), limit=20)
    '[0, 1, 2, 3, 4, 5, 6... (a list of 1000 items)'
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["preview"]

# Past this many bits an integer is shown by its size: repr() of a huge one is slow, then refused.
_INT_BITS = 128


def preview(value: Any, limit: int = 60) -> str:
    """``repr(value)`` when it is at most ``limit`` characters, else its start and what it is."""
    text: list[str] = []
    used = 0
    for piece in _pieces(value, limit):
        text.append(piece)
        used += len(piece)
        if used > limit:
            return "".join(text)[:limit] + f"... ({describe(value)})"
    return "".join(text)


def describe(value: Any) -> str:
    """What a value is, in words, without looking inside it: ``a list of 3 items``."""
    if isinstance(value, dict):
        return f"a mapping of {_count(len(value), 'key')}"
    if isinstance(value, (list, tuple, set, frozenset)):
        return f"a {type(value).__name__} of {_count(len(value), 'item')}"
    if isinstance(value, (str, bytes)):
        return f"{len(value)} characters" if isinstance(value, str) else f"{len(value)} bytes"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"an integer of about {_digits(value)} digits"
    return f"a {type(value).__name__}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _digits(value: int) -> int:
    return int(abs(value).bit_length() * 0.30103) + 1  # log10(2): no str() of the number


def _pieces(value: Any, limit: int) -> Iterator[str]:
    """repr(value), a few characters at a time; the caller stops reading when it has enough."""
    if isinstance(value, (str, bytes)):
        # One character past the limit is enough to know it is cut; repr of a slice keeps the quoting.
        yield repr(value[: limit + 1])
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > _INT_BITS:
        yield f"<{describe(value)}>"
    elif isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ", " if i else ""
            yield from _pieces(key, limit)
            yield ": "
            yield from _pieces(item, limit)
        yield "}"
    elif isinstance(value, (list, tuple, set, frozenset)):
        brackets = {list: "[]", tuple: "()"}.get(type(value), "{}")
        opening, closing = brackets[0], brackets[1]
        if isinstance(value, (set, frozenset)) and not value:
            yield f"{type(value).__name__}()"
            return
        yield opening
        for i, item in enumerate(value):
            yield ", " if i else ""
            yield from _pieces(item, limit)
        yield "," + closing if isinstance(value, tuple) and len(value) == 1 else closing
    else:
        yield repr(value)
