"""Value kinds of environment variables: how a string in the environment becomes a typed value
and back. Each kind raises ``ValueError`` naming the variable, the bad value and what is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Bool", "Choice", "Float", "Int", "Kind", "Str", "StrList"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class Kind(Protocol):
    def parse(self, name: str, raw: str) -> Any: ...

    def format(self, name: str, value: Any) -> str: ...


def _bad(name: str, raw: object, expected: str) -> ValueError:
    return ValueError(f"{name}={raw!r} is not valid: expected {expected}")


@dataclass(frozen=True)
class Bool:
    def parse(self, name: str, raw: str) -> bool:
        word = raw.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise _bad(name, raw, f"a boolean ({', '.join(_TRUE)} or {', '.join(_FALSE)})")

    def format(self, name: str, value: Any) -> str:
        if not isinstance(value, bool):
            raise _bad(name, value, "True or False")
        return "1" if value else "0"


@dataclass(frozen=True)
class Int:
    minimum: int | None = None
    maximum: int | None = None

    def _describe(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"an integer from {self.minimum} to {self.maximum}"
        if self.minimum is not None:
            return f"an integer >= {self.minimum}"
        if self.maximum is not None:  # pragma: no cover - no variable uses an upper bound alone
            return f"an integer <= {self.maximum}"
        return "an integer"

    def _check(self, name: str, raw: object, value: int) -> int:
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            raise _bad(name, raw, self._describe())
        return value

    def parse(self, name: str, raw: str) -> int:
        try:
            value = int(raw.strip(), 10)
        except ValueError:
            raise _bad(name, raw, self._describe()) from None
        return self._check(name, raw, value)

    def format(self, name: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(name, value, self._describe())
        return str(self._check(name, value, value))


@dataclass(frozen=True)
class Float:
    minimum: float | None = None

    def _describe(self) -> str:
        return "a number" if self.minimum is None else f"a number >= {self.minimum:g}"

    def _check(self, name: str, raw: object, value: float) -> float:
        if not math.isfinite(value) or (self.minimum is not None and value < self.minimum):
            raise _bad(name, raw, self._describe())
        return value

    def parse(self, name: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise _bad(name, raw, self._describe()) from None
        return self._check(name, raw, value)

    def format(self, name: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(name, value, self._describe())
        return repr(float(self._check(name, value, float(value))))


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of words, matched case-insensitively and returned as spelled here."""

    choices: tuple[str, ...]

    def parse(self, name: str, raw: str) -> str:
        word = raw.strip().lower()
        for choice in self.choices:
            if choice.lower() == word:
                return choice
        raise _bad(name, raw, f"one of {', '.join(self.choices)}")

    def format(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _bad(name, value, f"one of {', '.join(self.choices)}")
        return self.parse(name, value)


@dataclass(frozen=True)
class Str:
    def parse(self, name: str, raw: str) -> str:
        if not raw.strip():
            raise _bad(name, raw, "a non-empty string")
        return raw

    def format(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _bad(name, value, "a string")
        return self.parse(name, value)


@dataclass(frozen=True)
class StrList:
    """Comma-separated names, e.g. transformer layer classes to wrap."""

    def parse(self, name: str, raw: str) -> tuple[str, ...]:
        items = tuple(part.strip() for part in raw.split(","))
        if not raw.strip() or any(not item for item in items):
            raise _bad(name, raw, "comma-separated non-empty names, e.g. 'LlamaDecoderLayer,LlamaMLP'")
        return items

    def format(self, name: str, value: Any) -> str:
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(i, str) for i in value):
            raise _bad(name, value, "a list of names")
        return ",".join(self.parse(name, ",".join(value)))
