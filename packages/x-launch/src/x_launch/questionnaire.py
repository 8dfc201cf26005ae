"""``x-launch config``: the questions, their detected defaults, and re-asking on a bad answer.

Each question is its setting's row in the table (``x_launch.launch_config``): the row's
``question`` is asked, its ``describe()`` is the hint, and its kind checks the answer as the
config file is checked, so the questionnaire can never write a file that ``x-launch`` would
then refuse. Which questions come, and their defaults, depend on the answers so far: that
flow is this module.
"""

from __future__ import annotations

from typing import Any

import click

from x_launch.config_schema import all_fields

__all__ = ["ask_config"]

_ENVIRONMENTS = {"this machine": "this", "several machines": "several", "slurm": "slurm"}


def _ask(key: str, default: Any) -> Any:
    """The answer to ``key``'s question, checked; Enter gives ``default``."""
    row = all_fields()[key]

    def convert(text: Any) -> Any:
        try:
            return row.check(key, text)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    hint = f" ({row.describe()})"
    shown = "" if default is None else ("yes" if default is True else "no" if default is False else default)
    return click.prompt(row.question + hint, default=shown, value_proc=convert, show_default=default is not None)


def ask_config(*, gpus: int) -> dict[str, Any]:
    """Ask the questions; defaults come from what was detected (``gpus`` CUDA devices)."""
    where = click.prompt(
        "Where will the job run?",
        type=click.Choice(list(_ENVIRONMENTS), case_sensitive=False),
        default="this machine",
    )
    values: dict[str, Any] = {"compute_environment": "SLURM" if where.lower() == "slurm" else "LOCAL_MACHINE"}
    default_type = "MULTI_GPU" if gpus > 1 else "NO"
    values["distributed_type"] = _ask("distributed_type", default_type)
    if _ENVIRONMENTS[where.lower()] == "several":
        values["num_machines"] = _ask("num_machines", 2)
        values["machine_rank"] = _ask("machine_rank", 0)
        values["main_process_ip"] = _ask("main_process_ip", None)
        values["main_process_port"] = _ask("main_process_port", 29500)
        values["rdzv_backend"] = _ask("rdzv_backend", "static")
    else:
        values["num_machines"], values["machine_rank"] = 1, 0
    multi = values["distributed_type"] != "NO"
    default_procs = max(gpus, 1) * values["num_machines"] if gpus else (2 if multi else 1)
    values["num_processes"] = _ask("num_processes", default_procs)
    if gpus and values["distributed_type"] != "MULTI_CPU":
        values["gpu_ids"] = _ask("gpu_ids", "all")
    values["use_cpu"] = gpus == 0 or values["distributed_type"] == "MULTI_CPU"
    values["mixed_precision"] = _ask("mixed_precision", "no")
    backend = _ask("dynamo_config.dynamo_backend", "NO")
    if backend != "NO":
        values["dynamo_config.dynamo_backend"] = backend
        values["dynamo_config.dynamo_mode"] = _ask("dynamo_config.dynamo_mode", "default")
    if values["distributed_type"] == "FSDP":
        values["fsdp_config.fsdp_version"] = _ask("fsdp_config.fsdp_version", 2)
        policy = _ask("fsdp_config.fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
        values["fsdp_config.fsdp_auto_wrap_policy"] = policy
        if policy == "TRANSFORMER_BASED_WRAP":
            values["fsdp_config.fsdp_transformer_layer_cls_to_wrap"] = _ask(
                "fsdp_config.fsdp_transformer_layer_cls_to_wrap", None
            )
        values["fsdp_config.fsdp_state_dict_type"] = _ask("fsdp_config.fsdp_state_dict_type", "SHARDED_STATE_DICT")
        values["fsdp_config.fsdp_offload_params"] = _ask("fsdp_config.fsdp_offload_params", False)
        values["fsdp_config.fsdp_activation_checkpointing"] = _ask("fsdp_config.fsdp_activation_checkpointing", False)
    if values["distributed_type"] == "DEEPSPEED":
        values["deepspeed_config.zero_stage"] = _ask("deepspeed_config.zero_stage", 2)
        values["deepspeed_config.offload_optimizer_device"] = _ask("deepspeed_config.offload_optimizer_device", "none")
        if values["deepspeed_config.zero_stage"] == 3:
            values["deepspeed_config.offload_param_device"] = _ask("deepspeed_config.offload_param_device", "none")
        values["deepspeed_config.gradient_accumulation_steps"] = _ask("deepspeed_config.gradient_accumulation_steps", 1)
        values["deepspeed_config.gradient_clipping"] = _ask("deepspeed_config.gradient_clipping", 1.0)
    return values
