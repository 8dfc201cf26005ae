"""The effective launch config and where each value came from.

Precedence: command-line flag > ``X_LAUNCH_<FLAG>`` environment variable > config file >
default. Keeping the source of every value lets ``x-launch config show`` and ``--dry-run``
answer "why is it 4 processes?" without guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from x_common import env
from x_launch.config import parallelism
from x_launch.config.file import ConfigError, LoadedConfig
from x_launch.config.launch_config import TABLE, LaunchConfig, Setting

__all__ = ["ELASTIC_RESTARTS", "resolve"]

ELASTIC_RESTARTS = 3  # restarts an elastic job gets unless told: each lost machine takes one


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
    flags, spelled = _machine_range(dict(flags or {}), environ)
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
    if spelled:
        for key in ("num_machines", "min_machines", "max_machines"):
            settings[key] = Setting(settings[key].value, spelled)
    settings = parallelism.implied(_deepspeed_accumulation(settings))
    return LaunchConfig.from_settings(_elastic_counts(settings))


def _deepspeed_accumulation(settings: dict[str, Setting]) -> dict[str, Setting]:
    """Under DeepSpeed, ``deepspeed_config.gradient_accumulation_steps`` is the run's accumulation.

    As ``accelerate launch`` does with the files it writes (the only place they hold the value):
    it applies unless ``gradient_accumulation_steps`` itself was given, by flag, variable or file.
    """
    kind, steps = settings.get("distributed_type"), settings.get("deepspeed_config.gradient_accumulation_steps")
    if kind is None or kind.value != "DEEPSPEED" or steps is None or steps.value is None:
        return settings
    if "gradient_accumulation_steps" not in settings:
        settings["gradient_accumulation_steps"] = Setting(steps.value, f"{steps.source} (deepspeed_config)")
    return settings


def _machine_range(flags: dict[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """``--num_machines MIN:MAX`` (torchrun's ``--nnodes`` spelling) as ``--min_machines``/``--max_machines``.

    Returns the flags and, when a range was given, where (the source its three settings show).
    """
    given = flags.get("num_machines")
    source = "--num_machines"
    if given is None:
        source = env.launch_flag_var("num_machines")
        given = environ.get(source, "").strip() or None
    if given is None or ":" not in str(given):
        return flags, None
    low, _, high = str(given).partition(":")
    for flag in ("min_machines", "max_machines"):
        if flags.get(flag) is not None:
            raise ConfigError(f"{source} {given} and --{flag} both set the machine range: give one")
    if not low.strip().isdigit() or not high.strip().isdigit():
        raise ConfigError(f"{source}: {given!r} is not valid: expected N, or MIN:MAX with two integers (e.g. 2:4)")
    flags.update(num_machines=high.strip(), min_machines=low.strip(), max_machines=high.strip())
    return flags, f"{source} {given}"


def _elastic_counts(settings: dict[str, Setting]) -> dict[str, Setting]:
    """``max_machines`` is ``num_machines`` (the count every other rule reads); MIN above MAX is refused."""
    high, count, low = settings.get("max_machines"), settings.get("num_machines"), settings.get("min_machines")
    if high is not None:
        if count is not None and count.value != high.value:
            raise ConfigError(
                f"num_machines {count.value} ({count.source}) and max_machines {high.value} ({high.source}) "
                "disagree: give one"
            )
        settings["num_machines"] = high
    machines = settings.get("num_machines", Setting(1, "default"))
    if low is None or low.value == machines.value:
        return settings
    if low.value > machines.value:
        raise ConfigError(
            f"min_machines {low.value} ({low.source}) is above the most machines, {machines.value} "
            f"({machines.source}): use MIN:MAX with MIN <= MAX, e.g. --num_machines {machines.value}:{low.value}"
        )
    # Machines that come and go need a rendezvous that can form again (c10d), and restarts: with
    # torchrun's default of none, the first lost machine would end the job.
    backend = settings.get("rdzv_backend")
    if backend is not None and backend.value == "static":
        raise ConfigError(
            f"--num_machines {low.value}:{machines.value} needs the c10d rendezvous, but rdzv_backend is "
            f"static ({backend.source}): drop it or set --rdzv_backend c10d"
        )
    elastic = f"elastic default ({low.source})"
    settings["rdzv_backend"] = Setting("c10d", elastic)
    settings.setdefault("max_restarts", Setting(ELASTIC_RESTARTS, elastic))
    return settings
