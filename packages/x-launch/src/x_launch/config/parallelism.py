"""Accelerate's ParallelismConfig at launch: when it is on, what the ranks get, and what is refused.

``--use_parallelism_config`` and the ``--parallelism_config_*`` options (a config file's
``parallelism_config`` section, Accelerate's keys) are rows of the settings table
(``x_launch.config.launch_config``). They are one setting in the end, the device mesh the ranks
build, so three rules hold them together here:

- it is on when ``use_parallelism_config`` says so, else when any of its keys was given: a flag,
  an ``X_LAUNCH_*`` variable, or a non-empty section in the config file (``accelerate launch``
  turns it on for a non-empty section, and would ignore a size flag without the switch);
- on, the ranks get what ``accelerate launch`` 1.15 writes (``prepare_extend_env_parallelism_config``):
  ``ACCELERATE_USE_PARALLELISM_CONFIG``, the five sizes and two backends, the context-parallel
  strategy when ``cp_size`` > 1 and the sequence-parallel extras when ``sp_size`` > 1, written
  through ``x_common.env``'s variables; off, none of them;
- before anything starts, what x-runtime cannot run is one line (exit code 2): sequence
  parallelism, DeepSpeed with sharded, tensor or context parallel sizes, FSDP1 (as
  ``accelerate launch``), context parallelism on CPU, and sizes whose product is not the job's process count (all ones is accepted: the runtime
  replicates over every process, as Accelerate does).

Which strategy trains is x-runtime's decision from the sizes (``dp_shard`` or ``cp`` > 1: FSDP2;
``tp`` alone: tensor parallel without FSDP); unlike ``accelerate launch``, no ``--use_fsdp`` is needed.

Examples:
    >>> from x_launch.config.launch_config import LaunchConfig, Setting
    >>> given = {"num_processes": Setting(4, "--num_processes")}
    >>> for name in ("tp", "dp_shard"):
    ...     given[f"parallelism_config.parallelism_config_{name}_size"] = Setting(2, f"--parallelism_config_{name}_size")
    >>> config = LaunchConfig.from_settings(implied(given))
    >>> config["use_parallelism_config"]
    Setting(value=True, source='implied by --parallelism_config_tp_size')
    >>> check(config)  # 2 x 2 = 4 processes: nothing to refuse
    >>> env.to_environ(environment(config))["PARALLELISM_CONFIG_DP_SHARD_SIZE"]
    '2'
"""

from __future__ import annotations

import math
from typing import Any

from x_common import env
from x_launch.config.file import ConfigError
from x_launch.config.launch_config import TABLE, LaunchConfig, Setting
from x_launch.config.option import Option

__all__ = ["SECTION", "USE", "check", "environment", "implied", "owns"]

SECTION = "parallelism_config"
USE = "use_parallelism_config"
_PREFIX = "parallelism_config_"  # Accelerate's keys and flags: parallelism_config_tp_size
_SIZES = ("dp_replicate", "dp_shard", "tp", "cp", "sp")
# Written only when their dimension is in use, as accelerate launch does.
_WITH_CP = ("cp_comm_strategy",)
_WITH_SP = ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")
_ROWS: tuple[Option, ...] = tuple(row for row in TABLE if row.section == SECTION)


def owns(row: Option) -> bool:
    """Whether ``row`` travels by this module's rule rather than as every other row does."""
    return row.key == USE or row.section == SECTION


def implied(settings: dict[str, Setting]) -> dict[str, Setting]:
    """``settings`` (by config key) with ``use_parallelism_config`` on when a key of the section was given.

    An explicit ``use_parallelism_config`` (flag, variable or file) stands as given.
    """
    if USE in settings:
        return settings
    given = next((setting for key, setting in settings.items() if key.startswith(f"{SECTION}.")), None)
    if given is not None:
        settings[USE] = Setting(True, f"implied by {given.source}")
    return settings


def _size(config: LaunchConfig, name: str) -> int:
    return int(getattr(config, f"{_PREFIX}{name}_size"))


def environment(config: LaunchConfig) -> dict[env.EnvVar, Any]:
    """The variables ``accelerate launch`` writes for ``config``'s ParallelismConfig; empty when it is off."""
    if not config.use_parallelism_config:
        return {}
    values: dict[env.EnvVar, Any] = {env.USE_PARALLELISM_CONFIG: True}
    for row in _ROWS:
        name = row.flag.removeprefix(_PREFIX)
        if (name in _WITH_CP and _size(config, "cp") <= 1) or (name in _WITH_SP and _size(config, "sp") <= 1):
            continue
        value = getattr(config, row.name)
        if value is not None:
            values.update(row.environment(value))
    return values


def _given(config: LaunchConfig, name: str) -> str:
    """``parallelism_config_tp_size 2 (from --parallelism_config_tp_size)``: a size and where it came from."""
    key = f"{SECTION}.{_PREFIX}{name}_size"
    return f"{_PREFIX}{name}_size {_size(config, name)} (from {config.source(key)})"


def check(config: LaunchConfig, *, cpu_only: str | None = None) -> None:
    """Refuse a ParallelismConfig that x-runtime cannot run with these processes, before anything starts.

    Args:
        config: the settings after SLURM and the GPU count decided ``num_processes`` (the job's processes).
        cpu_only: why the ranks have no GPU (``--cpu``, no NVIDIA GPU here), or ``None`` when they may.

    Raises:
        ConfigError: one line naming the size, where it came from and what runs instead.
    """
    if not config.use_parallelism_config:
        return
    sizes = {name: _size(config, name) for name in _SIZES}
    if sizes["sp"] > 1:
        raise ConfigError(
            f"{_given(config, 'sp')}: x does not train sequence parallelism (DeepSpeed Ulysses); x-runtime trains "
            "DDP, FSDP2, HSDP, tensor and context parallelism: use --parallelism_config_cp_size on GPUs for long "
            "sequences, or --parallelism_config_dp_shard_size / --parallelism_config_tp_size to fit the model"
        )
    split = next((name for name in ("dp_shard", "tp", "cp") if sizes[name] > 1), None)
    if config.distributed_type == "DEEPSPEED" and split is not None:
        raise ConfigError(
            f"{_given(config, split)} cannot run under DeepSpeed (distributed_type DEEPSPEED from "
            f"{config.source('distributed_type')}): x-runtime builds these meshes with FSDP2 and tensor "
            "parallelism; drop DeepSpeed, or the parallelism_config sizes"
        )
    if config.distributed_type == "FSDP" and config.fsdp_version == 1:
        raise ConfigError(
            f"fsdp_version 1 (from {config.source('fsdp_config.fsdp_version')}) cannot shard over a ParallelismConfig "
            "mesh: use --fsdp_version 2, as accelerate launch requires, or drop the parallelism_config keys"
        )
    if sizes["cp"] > 1 and cpu_only is not None:
        raise ConfigError(
            f"{_given(config, 'cp')}: context parallelism runs on GPUs only, and these ranks run on CPU ({cpu_only}): "
            "launch on GPUs, or shard with --parallelism_config_dp_shard_size / --parallelism_config_tp_size"
        )
    product, processes = math.prod(sizes.values()), config.num_processes
    if product not in (1, processes):
        factors = " x ".join(f"{name} {size}" for name, size in sizes.items())
        raise ConfigError(
            f"parallelism_config sizes multiply to {product} ({factors}), but the job runs {processes} process(es) "
            f"(num_processes from {config.source('num_processes')}): make the sizes multiply to {processes}, "
            f"or launch {product} processes (--num_processes {product}, all machines together)"
        )
