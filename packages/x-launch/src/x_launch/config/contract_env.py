"""The environment the launcher gives every process it starts: the runtime's half of the config.

Derived from the settings table: each row with a contract variable (``Option.env``) travels as
that variable, validated by the variable's own kind, so the runtime reads back exactly what was
resolved. Top-level settings always travel; section settings (``fsdp_config.*``, ...) only
when something set them, since the runtime has the same defaults. The ParallelismConfig rows
travel together, by ``x_launch.config.parallelism``'s rule (Accelerate's variables, when it is on).

Examples:
    >>> from x_launch.config.launch_config import LaunchConfig, Setting
    >>> config = LaunchConfig().updated({"mixed_precision": Setting("bf16", "--mixed_precision")})
    >>> contract_environment(config) == env.to_environ(
    ...     {env.LAUNCHED_BY_X: True, env.DISTRIBUTED_TYPE: "NO", env.MIXED_PRECISION: "bf16",
    ...      env.USE_CPU: False, env.GRADIENT_ACCUMULATION_STEPS: 1, env.DEBUG_MODE: False})
    True
"""

from __future__ import annotations

from typing import Any

from x_common import env
from x_launch.config import parallelism
from x_launch.config.launch_config import TABLE, LaunchConfig

__all__ = ["contract_environment"]


def _served_here() -> bool:
    """Whether this launcher runs with x serving accelerate (``accelerate launch`` under ``X_PROVIDE_ACCELERATE=1``)."""
    try:
        return bool(env.PROVIDE_ACCELERATE.read())
    except ValueError:
        return False


def contract_environment(config: LaunchConfig) -> dict[str, str]:
    """``{variable name: text}`` for every contract variable the launch sets."""
    values: dict[env.EnvVar, Any] = {env.LAUNCHED_BY_X: True}
    # Translated rows last: an FSDP1 strategy written into fsdp_reshard_after_forward (as
    # Accelerate does) overrides fsdp_sharding_strategy.
    for row in sorted(TABLE, key=lambda row: row.to_env is not None):
        value = getattr(config, row.name)
        if value is None or (row.section is not None and config.is_default(row.key)) or parallelism.owns(row):
            continue
        values.update(row.environment(value))
    # ParallelismConfig: all of its variables when it is on, none when it is off, as accelerate launch.
    values.update(parallelism.environment(config))
    # accelerate launch --multi_gpu means "several processes": on a machine without GPUs, CPU ones.
    inferred = config.is_default("distributed_type") or config.source("distributed_type") == "--multi_gpu"
    if inferred and config.num_processes > 1:
        # "NO" with several processes means "infer": on CPU that is MULTI_CPU; with GPUs the
        # runtime picks, since finding them here would mean importing torch.
        if config.use_cpu:
            values[env.DISTRIBUTED_TYPE] = "MULTI_CPU"
        else:
            values.pop(env.DISTRIBUTED_TYPE, None)
    provided = config.provide_accelerate or _served_here()
    if not config.provide_accelerate:
        values.pop(env.PROVIDE_ACCELERATE, None)  # what the launcher's own environment says reaches the ranks
    environ = env.to_environ(values)
    if provided:
        # transformers' TrainingArguments and PEFT read Accelerate's variables themselves (mixed precision,
        # CPU, FSDP/DeepSpeed): under x serving accelerate they see the launch as `accelerate launch` shows it.
        for var, value in values.items():
            for name, text in var.accelerate_spelling(value).items():
                environ.setdefault(name, text)
    return environ
