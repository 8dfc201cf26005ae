"""One row of the settings table: a launcher setting and everything derived from it.

A row says what a setting is (its kind, default and meaning) and where it appears: its key in
the config file (Accelerate's YAML key), its flag name (``--<flag>`` and ``X_LAUNCH_<FLAG>``),
its spellings on the command line, its question in ``x-launch config``, and the contract
variable that carries it to the runtime. Rows are declared as the fields of
``x_launch.config.launch_config.LaunchConfig`` with ``option()``, so a setting is written once and
its typed attribute comes with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from x_common.env import EnvVar, launch_flag_var
from x_common.kinds import Kind

__all__ = ["Option", "Setting", "flag_spellings", "option", "rows_of"]

_ROW = "x_launch.config.option"  # the key of a row in its dataclass field's metadata


@dataclass(frozen=True)
class Setting:
    """A value and where it came from: ``default``, ``config file <path>``, a variable or ``--<flag>``."""

    value: Any
    source: str


@dataclass(frozen=True)
class Option:
    """A launcher setting.

    Attributes:
        name: the attribute on ``LaunchConfig`` (Accelerate's key without its section).
        key: Accelerate's YAML key, ``section.key`` inside a section (``fsdp_config.fsdp_version``).
        kind: checks and converts values (``x_common.kinds``).
        default: the value when nothing sets it.
        doc: what it means, in a few words.
        env: the contract variable that carries it to the training processes, if the runtime needs it.
        to_env: the variables and values for a setting that does not travel as itself (its
            value is translated); by default ``{env: value}``.
        flag: ``--<flag>`` and ``X_LAUNCH_<FLAG>`` name it; by default the key without its
            section, as in Accelerate (two keys may share a flag: one flag sets both).
        cli: spellings on the ``x-launch`` command line; empty: config file and variable only.
            ``option(cli=True)`` means ``--<flag>`` and ``--<flag-with-dashes>``, as Accelerate.
        switch: on the command line, a flag without a value (``--cpu``), not ``--key VALUE``.
        aliases: ``(flag, value)``: command-line switches that set this setting to a value
            (``--use_fsdp`` is ``distributed_type FSDP``), as ``accelerate launch`` has them.
        cli_help: ``--help`` text of a command-line option.
        question: what ``x-launch config`` asks for it.
    """

    name: str
    key: str
    kind: Kind
    default: Any = None
    doc: str = ""
    env: EnvVar | None = None
    to_env: Callable[[Any], Mapping[EnvVar, Any]] | None = None
    flag: str = ""
    cli: tuple[str, ...] = ()
    switch: bool = False
    aliases: tuple[tuple[str, Any], ...] = ()
    cli_help: str | None = None
    question: str = ""

    @property
    def section(self) -> str | None:
        """The YAML section holding the key (``fsdp_config``), or ``None`` for a top-level key."""
        section, dot, _ = self.key.partition(".")
        return section if dot else None

    @property
    def flag_var(self) -> str:
        """The ``X_LAUNCH_*`` variable that supplies the setting when no flag does."""
        return launch_flag_var(self.flag)

    @property
    def choices(self) -> tuple[str, ...]:
        """The words the kind accepts (empty for kinds without a fixed set)."""
        return tuple(getattr(self.kind, "choices", ()))

    def describe(self) -> str:
        """What a value must be, e.g. ``an integer >= 1``."""
        return self.kind.describe()

    def check(self, name: str, value: Any) -> Any:
        """``value`` in canonical form; ``None`` stays ``None`` (unset).

        Args:
            name: how the error names the value's origin: the key, the flag or the variable.

        Raises:
            ValueError: ``name: 'value' is not valid: expected ...``, one line.
        """
        return None if value is None else self.kind.check(name, value)

    def environment(self, value: Any) -> dict[EnvVar, Any]:
        """The contract variables for ``value``, typed as the runtime reads them; empty without ``env``.

        The value goes through text: this kind writes it, the variable's kind reads it, so
        ``INDUCTOR`` arrives as the runtime's ``inductor`` and ``A,B`` as ``("A", "B")``.
        """
        if self.to_env is not None:
            return dict(self.to_env(value))
        if self.env is None:
            return {}
        text = self.kind.format(self.key, value)
        return {self.env: self.env.kind.parse(self.env.name, text)}


def flag_spellings(flag: str) -> tuple[str, ...]:
    """``--flag_name`` and ``--flag-name``: Accelerate's two spellings of a flag."""
    dashed = flag.replace("_", "-")
    return (f"--{flag}", f"--{dashed}") if dashed != flag else (f"--{flag}",)


def option(kind: Kind, default: Any = None, *, section: str | None = None, key: str | None = None, **row: Any) -> Any:
    """A ``LaunchConfig`` field that is a row of the settings table.

    Args:
        kind: the row's kind.
        default: the row's default, also the attribute's default.
        section: the YAML section of the key; the key is ``section.<attribute name>``.
        key: the YAML key, when it is not the attribute name (two sections may hold one name).
        **row: the other ``Option`` fields (``doc``, ``env``, ``cli``, ...).
    """
    spec = {"kind": kind, "default": default, "section": section, "key": key, **row}
    return dataclasses.field(default=default, metadata={_ROW: spec})


def rows_of(cls: type) -> tuple[Option, ...]:
    """The settings table declared by ``cls``'s ``option()`` fields, in declaration order."""
    rows = []
    for field in dataclasses.fields(cls):
        spec = dict(field.metadata.get(_ROW) or {})
        if not spec:
            continue
        section = spec.pop("section")
        key = spec.pop("key") or (f"{section}.{field.name}" if section else field.name)
        flag = spec.pop("flag", "") or key.rpartition(".")[2]
        if spec.get("cli") is True:
            spec["cli"] = flag_spellings(flag)
        rows.append(Option(name=field.name, key=key, flag=flag, **spec))
    return tuple(rows)
