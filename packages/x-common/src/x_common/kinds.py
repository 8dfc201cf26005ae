"""Value kinds: how a string or a YAML value becomes a typed value, and back to a string.

One implementation for every x package: ``x_common.env`` reads and writes the environment with
these kinds, and ``x-launch`` checks its config file, flags and questionnaire answers with them.
Each kind converts a value three ways, and each way words its error for where the value came from:

- ``parse(name, raw)``: a string from the environment; ``NAME='raw' is not valid: expected ...``
  lists the accepted spellings (``describe_text()``);
- ``check(name, value)``: a value from a YAML file (already typed) or a flag (a string);
  ``name: 'value' is not valid: expected ...`` says what the value must be (``describe()``);
- ``format(name, value)``: the string that ``parse`` turns back into ``value``.

Examples:
    >>> Int(minimum=1).check("num_processes", "4")
    4
    >>> Choice(("no", "bf16")).parse("PRECISION", "BF16")
    'bf16'
    >>> Bool().check("use_cpu", "maybe")
    Traceback (most recent call last):
    ...
    ValueError: use_cpu: 'maybe' is not valid: expected true or false
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Bool", "BoolOrChoice", "Choice", "Float", "GpuIds", "Int", "Kind", "Numbered", "Str", "StrList"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class Kind(Protocol):
    """What every kind offers; see the module docstring for the three conversions."""

    def parse(self, name: str, raw: str) -> Any: ...

    def check(self, name: str, value: Any) -> Any: ...

    def format(self, name: str, value: Any) -> str: ...

    def describe(self) -> str: ...


class _Refused(Exception):
    """Raised by ``_convert``; the public methods turn it into a worded ``ValueError``."""


def _bad(name: str, raw: object, expected: str) -> ValueError:
    return ValueError(f"{name}={raw!r} is not valid: expected {expected}")


class _Converting:
    """``parse`` and ``check`` on top of one ``_convert``: a string and a YAML value obey the same rules."""

    def _convert(self, value: Any) -> Any:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def describe_text(self) -> str:
        """What a string in the environment must be; the same as ``describe()`` unless said otherwise."""
        return self.describe()

    def parse(self, name: str, raw: str) -> Any:
        """The typed value of ``raw``, a string from the environment.

        Raises:
            ValueError: ``NAME='raw' is not valid: expected ...``.
        """
        try:
            return self._convert(raw)
        except _Refused:
            raise _bad(name, raw, self.describe_text()) from None

    def check(self, name: str, value: Any) -> Any:
        """The canonical value of ``value``, from a YAML file (typed) or a flag (a string).

        Raises:
            ValueError: ``name: 'value' is not valid: expected ...``, one line.
        """
        try:
            return self._convert(value)
        except _Refused:
            raise ValueError(f"{name}: {value!r} is not valid: expected {self.describe()}") from None


@dataclass(frozen=True)
class Bool(_Converting):
    # Written as "true"/"false" for readers that compare the text (Accelerate's `== "true"`).
    words: bool = False

    def _convert(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise _Refused

    def describe(self) -> str:
        return "true or false"

    def describe_text(self) -> str:
        return f"a boolean ({', '.join(TRUE_WORDS)} or {', '.join(FALSE_WORDS)})"

    def format(self, name: str, value: Any) -> str:
        if not isinstance(value, bool):
            raise _bad(name, value, "True or False")
        if self.words:
            return "true" if value else "false"
        return "1" if value else "0"


@dataclass(frozen=True)
class Int(_Converting):
    minimum: int | None = None
    maximum: int | None = None

    def describe(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"an integer from {self.minimum} to {self.maximum}"
        if self.minimum is not None:
            return f"an integer >= {self.minimum}"
        if self.maximum is not None:  # pragma: no cover - no setting uses an upper bound alone
            return f"an integer <= {self.maximum}"
        return "an integer"

    def _in_range(self, value: int) -> bool:
        return (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)

    def _convert(self, value: Any) -> int:
        if isinstance(value, bool):  # a YAML true is not a count
            raise _Refused
        try:
            number = int(str(value).strip(), 10)  # through str: 2.5 and "2.5" are refused alike
        except ValueError:
            raise _Refused from None
        if not self._in_range(number):
            raise _Refused
        return number

    def format(self, name: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, int) or not self._in_range(value):
            raise _bad(name, value, self.describe())
        return str(value)


@dataclass(frozen=True)
class Float(_Converting):
    minimum: float | None = None

    def describe(self) -> str:
        return "a number" if self.minimum is None else f"a number >= {self.minimum:g}"

    def _convert(self, value: Any) -> float:
        if isinstance(value, bool):
            raise _Refused
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (ValueError, TypeError):  # TypeError: a YAML list, mapping or date
            raise _Refused from None
        if not math.isfinite(number) or (self.minimum is not None and number < self.minimum):
            raise _Refused
        return number

    def format(self, name: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(name, value, self.describe())
        try:
            return repr(self._convert(value))
        except _Refused:
            raise _bad(name, value, self.describe()) from None


@dataclass(frozen=True)
class Choice(_Converting):
    """One of a fixed set of words, matched case-insensitively and returned as spelled here."""

    choices: tuple[str, ...]

    def describe(self) -> str:
        return f"one of {', '.join(self.choices)}"

    def _convert(self, value: Any) -> str:
        if isinstance(value, bool):
            # YAML 1.1 reads an unquoted NO / no / off as false: "distributed_type: NO" means "NO".
            value = "yes" if value else "no"
        word = str(value).strip().lower()
        for choice in self.choices:
            if choice.lower() == word:
                return choice
        raise _Refused

    def format(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _bad(name, value, self.describe())
        return self.parse(name, value)


@dataclass(frozen=True)
class Numbered(_Converting):
    """One of ``choices`` by name, or by its 1-based number in ``order``, as torch's enums count.

    Accelerate's files and variables may spell an FSDP setting ``SHARD_GRAD_OP`` or ``2``
    (``ShardingStrategy(2)``); ``order`` is Accelerate's list when it differs from ``choices``.
    """

    choices: tuple[str, ...]
    order: tuple[str, ...] = ()

    def describe(self) -> str:
        numbers = ", ".join(f"{i} ({name})" for i, name in enumerate(self.order or self.choices, 1))
        return f"one of {', '.join(self.choices)}, or its number: {numbers}"

    def _convert(self, value: Any) -> str:
        text = str(value).strip()
        order = self.order or self.choices
        if text.isdigit() and 1 <= int(text) <= len(order):
            return Choice(self.choices)._convert(order[int(text) - 1])
        return Choice(self.choices)._convert(value)

    def format(self, name: str, value: Any) -> str:
        return Choice(self.choices).format(name, value)


@dataclass(frozen=True)
class BoolOrChoice(_Converting):
    """A boolean, or one of some words (a key that two versions of a feature spell differently)."""

    choices: tuple[str, ...]

    def describe(self) -> str:
        return f"true, false or one of {', '.join(self.choices)}"

    def _convert(self, value: Any) -> bool | str:
        try:
            return Bool()._convert(value)
        except _Refused:
            return Choice(self.choices)._convert(value)

    def format(self, name: str, value: Any) -> str:
        return Bool().format(name, value) if isinstance(value, bool) else Choice(self.choices).format(name, value)


@dataclass(frozen=True)
class Str(_Converting):
    def describe(self) -> str:
        return "a string"

    def describe_text(self) -> str:
        return "a non-empty string"

    def _convert(self, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
            raise _Refused
        return str(value)

    def format(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _bad(name, value, "a string")
        return self.parse(name, value)


@dataclass(frozen=True)
class StrList(_Converting):
    """Comma-separated names, e.g. transformer layer classes to wrap.

    Args:
        joined: keep the value as one comma-joined string, as Accelerate's YAML files spell it,
            instead of a tuple of names.
    """

    joined: bool = False

    def describe(self) -> str:
        return "comma-separated names"

    def describe_text(self) -> str:
        return "comma-separated non-empty names, e.g. 'LlamaDecoderLayer,LlamaMLP'"

    def _convert(self, value: Any) -> tuple[str, ...] | str:
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        names = tuple(str(item).strip() for item in items)
        if not names or not all(names):
            raise _Refused
        return ",".join(names) if self.joined else names

    def format(self, name: str, value: Any) -> str:
        if self.joined and isinstance(value, str):
            return str(self.parse(name, value))
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(i, str) for i in value):
            raise _bad(name, value, "a list of names")
        return ",".join(StrList().parse(name, ",".join(value)))


@dataclass(frozen=True)
class GpuIds(_Converting):
    """``all``, or comma-separated GPU indices; returned as one string such as ``0,1``."""

    def describe(self) -> str:
        return "'all' or comma-separated GPU indices such as 0,1"

    def _convert(self, value: Any) -> str:
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value).strip()
        if text.lower() == "all":
            return "all"
        parts = [part.strip() for part in text.split(",")]
        if not all(part.isdigit() for part in parts):
            raise _Refused
        return ",".join(parts)

    def format(self, name: str, value: Any) -> str:
        return str(self.parse(name, str(value)))
