"""One environment variable of the contract (``EnvVar``) and Accelerate's spelling of it (``Fallback``).

The table of variables is ``x_common.env``, which re-exports both classes; this module holds how a
variable is read, validated and written, so the table stays a table.

Examples:
    >>> from x_common.kinds import Int
    >>> steps = EnvVar("X_STEPS", Int(minimum=1), 1, "steps", (Fallback("ACCELERATE_STEPS"),))
    >>> steps.read({}), steps.read({"ACCELERATE_STEPS": "4"}), steps.read({"X_STEPS": "2", "ACCELERATE_STEPS": "4"})
    (1, 4, 2)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from x_common.kinds import Bool, Kind

__all__ = ["EnvVar", "Fallback"]

# What Accelerate writes for "not given" (``str(None)``, DeepSpeed's ``auto``): read as unset.
_UNSET_WORDS = ("none", "auto")


@dataclass(frozen=True)
class Fallback:
    """Accelerate's variable for a setting, read when the ``X_*`` variable is unset.

    Attributes:
        name: Accelerate's variable, e.g. ``ACCELERATE_MIXED_PRECISION`` or ``FSDP_VERSION``.
        kind: how Accelerate spells the value, when the ``X_*`` variable's kind does not read it.
        means: for a switch (``ACCELERATE_USE_FSDP=true``): the value it stands for when true;
            false means "not this one".
        when: whether the fallback applies in this environment (Accelerate reads some
            variables only together with others, e.g. FSDP1's strategy not under FSDP2).
    """

    name: str
    kind: Kind | None = None
    means: Any = None
    when: Callable[[Mapping[str, str]], bool] | None = None

    def raw(self, environ: Mapping[str, str]) -> str | None:
        """The text that applies, or ``None`` (unset, empty, ``None``/``auto``, or ``when`` says no)."""
        raw = environ.get(self.name)
        if raw is None or raw.strip().lower() in ("", *_UNSET_WORDS):
            return None
        if self.when is not None and not self.when(environ):
            return None
        if self.means is not None and not Bool().parse(self.name, raw):
            return None
        return raw

    def value(self, raw: str, kind: Kind) -> Any:
        """The typed value of ``raw``; errors name Accelerate's variable."""
        return self.means if self.means is not None else (self.kind or kind).parse(self.name, raw)


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, value kind, default and meaning.

    ``fallbacks`` are Accelerate's variables for the same setting, tried in order when this
    one is unset, so a script started by ``accelerate launch`` runs as configured.
    """

    name: str
    kind: Kind = field(repr=False)
    default: Any = None
    doc: str = ""
    fallbacks: tuple[Fallback, ...] = field(default=(), repr=False)

    def _source(self, environ: Mapping[str, str]) -> tuple[str, Fallback | None] | None:
        raw = environ.get(self.name)
        if raw is not None and raw.strip() != "":
            return raw, None
        for fallback in self.fallbacks:
            text = fallback.raw(environ)
            if text is not None:
                return text, fallback
        return None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the variable, or one of its Accelerate fallbacks, is present (empty counts as absent)."""
        return self._source(os.environ if environ is None else environ) is not None

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        """Typed value from ``environ`` (default ``os.environ``), or the default when unset.

        The ``X_*`` variable wins; without it, the first Accelerate fallback that is set.

        Raises:
            ValueError: the value is malformed; the message names the variable, the value and
                the accepted values.
        """
        found = self._source(os.environ if environ is None else environ)
        if found is None:
            return self.default
        raw, fallback = found
        return self.kind.parse(self.name, raw) if fallback is None else fallback.value(raw, self.kind)

    def format(self, value: Any) -> str:
        """The string that ``read`` turns back into ``value``.

        Raises:
            ValueError: ``value`` is not of this variable's kind.
        """
        return self.kind.format(self.name, value)

    def accelerate_spelling(self, value: Any) -> dict[str, str]:
        """Accelerate's variables for ``value``, as ``accelerate launch`` sets them, where they are plain.

        For libraries that read Accelerate's variables themselves (transformers' ``TrainingArguments``
        reads ``ACCELERATE_MIXED_PRECISION``); a fallback that Accelerate spells in its own way
        (numbered, conditional) is left out. A switch (``ACCELERATE_USE_FSDP``) is set when ``value`` is
        what it stands for.

        Examples:
            >>> cpu = EnvVar("X_CPU", Bool(), False, "", (Fallback("ACCELERATE_USE_CPU"),))
            >>> cpu.accelerate_spelling(True)
            {'ACCELERATE_USE_CPU': '1'}
        """
        spelled: dict[str, str] = {}
        for fallback in self.fallbacks:
            if fallback.kind is not None or fallback.when is not None:
                continue
            if fallback.means is None:
                spelled.setdefault(fallback.name, self.format(value))
            elif value == fallback.means:
                spelled[fallback.name] = "true"
        return spelled

    def write(self, value: Any, environ: MutableMapping[str, str] | None = None) -> str:
        """Validate ``value``, store it in ``environ`` (default ``os.environ``), return the string."""
        text = self.format(value)
        (os.environ if environ is None else environ)[self.name] = text
        return text
