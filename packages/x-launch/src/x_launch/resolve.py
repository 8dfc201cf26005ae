"""The effective launch config and where each value came from.

Precedence: command-line flag > ``X_LAUNCH_<FLAG>`` environment variable > config file >
default. Keeping the source of every value lets ``x-launch config show`` and ``--dry-run``
answer "why is it 4 processes?" without guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from x_launch.config_file import ConfigError, LoadedConfig
from x_launch.launch_config import TABLE, LaunchConfig, Setting

__all__ = ["resolve"]


def resolve(
    loaded: LoadedConfig | None, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> LaunchConfig:
    """Every setting's typed value and source.

    Args:
        loaded: the config file, already checked, if there is one.
        flags: command-line values by flag name (``num_processes``, ``fsdp_version``); ``None``
            means not given. Strings are checked as the config file's values are.
        environ: where ``X_LAUNCH_*`` variables are read (default ``os.environ``).

    Raises:
        ConfigError: an ``X_LAUNCH_*`` variable or a flag holds an invalid value.
    """
    import os

    environ = os.environ if environ is None else environ
    flags = flags or {}
    settings: dict[str, Setting] = {}
    for row in TABLE:
        # accelerate launch's precedence: --use_deepspeed over --use_fsdp over --multi_gpu
        switched = [(f"--{flag}", value) for flag, value in row.aliases if flags.get(flag)]
        if switched and flags.get(row.flag) is not None:
            raise ConfigError(f"{switched[0][0]} and --{row.flag} contradict each other: pick one")
        if switched:
            value, source = switched[0][1], switched[0][0]
        elif flags.get(row.flag) is not None:
            value, source = flags[row.flag], f"--{row.flag}"
        elif environ.get(row.flag_var, "").strip():
            value, source = environ[row.flag_var], row.flag_var
        elif loaded is not None and row.key in loaded.values:
            settings[row.key] = Setting(loaded.values[row.key], f"config file {loaded.path}")
            continue
        else:
            continue  # the default
        try:
            settings[row.key] = Setting(row.check(source, value), source)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return LaunchConfig.from_settings(settings)
