"""The effective launch config and where each value came from.

Precedence: command-line flag > ``X_LAUNCH_<KEY>`` environment variable > config file >
default. Keeping the source of every value lets ``x-launch config show`` and ``--dry-run``
answer "why is it 4 processes?" without guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from x_common.env import launch_flag_var
from x_launch.config_file import ConfigError, LoadedConfig
from x_launch.config_schema import SCHEMA, SECTIONS, Field, check_value

__all__ = ["Setting", "all_fields", "resolve"]


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str  # "default", "config file <path>", the variable's name, or "--<flag>"


def all_fields() -> dict[str, Field]:
    """Every key: top-level ones, and "section.key" for section keys."""
    fields = dict(SCHEMA)
    for section, subs in SECTIONS.items():
        fields.update({f"{section}.{key}": spec for key, spec in subs.items()})
    return fields


def _flag_name(key: str) -> str:
    # Section keys are flags of their own, as in Accelerate: fsdp_config.fsdp_version -> --fsdp_version.
    return key.rpartition(".")[2]


def resolve(
    loaded: LoadedConfig | None, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, Setting]:
    """Every key's value and source.

    Raises:
        ConfigError: an ``X_LAUNCH_*`` variable or a flag holds an invalid value.
    """
    import os

    environ = os.environ if environ is None else environ
    flags = flags or {}
    settings: dict[str, Setting] = {}
    for key, spec in all_fields().items():
        name = _flag_name(key)
        var = launch_flag_var(name)
        if flags.get(name) is not None:
            value, source = flags[name], f"--{name}"
        elif environ.get(var, "").strip():
            value, source = environ[var], var
        elif loaded is not None and key in loaded.values:
            settings[key] = Setting(loaded.values[key], f"config file {loaded.path}")
            continue
        else:
            settings[key] = Setting(spec.default, "default")
            continue
        try:
            settings[key] = Setting(check_value(f"{source}", spec, value), source)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return settings
