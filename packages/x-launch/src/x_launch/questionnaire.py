"""``x-launch config``: the questions, their detected defaults, and re-asking on a bad answer.

Each answer is checked by the same ``check_value`` the config file goes through, so the
questionnaire can never write a file that ``x-launch`` would then refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from x_launch.config_schema import SCHEMA, SECTIONS, Field, check_value

__all__ = ["ask_config"]

_ENVIRONMENTS = {"this machine": "this", "several machines": "several", "slurm": "slurm"}


def _ask(key: str, question: str, default: Any, field: Field | None = None) -> Any:
    spec = field or SCHEMA[key]

    def convert(text: Any) -> Any:
        try:
            return check_value(key, spec, text)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    hint = f" ({spec.describe()})"
    shown = "" if default is None else ("yes" if default is True else "no" if default is False else default)
    return click.prompt(question + hint, default=shown, value_proc=convert, show_default=default is not None)


def _section(name: str) -> Callable[[str, str, Any], Any]:
    return lambda key, question, default: _ask(f"{name}.{key}", question, default, SECTIONS[name][key])


def ask_config(*, gpus: int) -> dict[str, Any]:
    """Ask the questions; defaults come from what was detected (``gpus`` CUDA devices)."""
    where = click.prompt(
        "Where will the job run?",
        type=click.Choice(list(_ENVIRONMENTS), case_sensitive=False),
        default="this machine",
    )
    values: dict[str, Any] = {"compute_environment": "SLURM" if where.lower() == "slurm" else "LOCAL_MACHINE"}
    default_type = "MULTI_GPU" if gpus > 1 else "NO"
    values["distributed_type"] = _ask(
        "distributed_type",
        "How should processes share the work (XLA for TPU)?",
        default_type,
    )
    if _ENVIRONMENTS[where.lower()] == "several":
        values["num_machines"] = _ask("num_machines", "How many machines?", 2)
        values["machine_rank"] = _ask("machine_rank", "Rank of this machine (0 on the main one)?", 0)
        values["main_process_ip"] = _ask("main_process_ip", "Address of the machine with rank 0?", None)
        values["main_process_port"] = _ask("main_process_port", "Port on that machine (0 picks a free one)?", 29500)
        values["rdzv_backend"] = _ask("rdzv_backend", "Rendezvous backend?", "static")
    else:
        values["num_machines"], values["machine_rank"] = 1, 0
    multi = values["distributed_type"] != "NO"
    default_procs = max(gpus, 1) * values["num_machines"] if gpus else (2 if multi else 1)
    values["num_processes"] = _ask("num_processes", "How many processes in total?", default_procs)
    if gpus and values["distributed_type"] != "MULTI_CPU":
        values["gpu_ids"] = _ask("gpu_ids", "Which GPUs on this machine?", "all")
    values["use_cpu"] = gpus == 0 or values["distributed_type"] == "MULTI_CPU"
    values["mixed_precision"] = _ask("mixed_precision", "Mixed precision?", "no")
    backend = _ask(
        "dynamo_config.dynamo_backend", "torch.compile backend?", "NO", SECTIONS["dynamo_config"]["dynamo_backend"]
    )
    if backend != "NO":
        values["dynamo_config.dynamo_backend"] = backend
        values["dynamo_config.dynamo_mode"] = _section("dynamo_config")("dynamo_mode", "torch.compile mode?", "default")
    if values["distributed_type"] == "FSDP":
        fsdp = _section("fsdp_config")
        values["fsdp_config.fsdp_version"] = fsdp("fsdp_version", "FSDP version?", 2)
        policy = fsdp("fsdp_auto_wrap_policy", "What to shard as a unit?", "TRANSFORMER_BASED_WRAP")
        values["fsdp_config.fsdp_auto_wrap_policy"] = policy
        if policy == "TRANSFORMER_BASED_WRAP":
            values["fsdp_config.fsdp_transformer_layer_cls_to_wrap"] = fsdp(
                "fsdp_transformer_layer_cls_to_wrap", "Layer classes to wrap (e.g. LlamaDecoderLayer)?", None
            )
        values["fsdp_config.fsdp_state_dict_type"] = fsdp(
            "fsdp_state_dict_type", "Checkpoint layout?", "SHARDED_STATE_DICT"
        )
        values["fsdp_config.fsdp_offload_params"] = fsdp("fsdp_offload_params", "Offload parameters to CPU?", False)
        values["fsdp_config.fsdp_activation_checkpointing"] = fsdp(
            "fsdp_activation_checkpointing", "Activation checkpointing?", False
        )
    if values["distributed_type"] == "DEEPSPEED":
        ds = _section("deepspeed_config")
        values["deepspeed_config.zero_stage"] = ds("zero_stage", "ZeRO stage?", 2)
        values["deepspeed_config.offload_optimizer_device"] = ds(
            "offload_optimizer_device", "Optimizer state on?", "none"
        )
        if values["deepspeed_config.zero_stage"] == 3:
            values["deepspeed_config.offload_param_device"] = ds("offload_param_device", "Parameters on?", "none")
        values["deepspeed_config.gradient_accumulation_steps"] = ds(
            "gradient_accumulation_steps", "Gradient accumulation steps?", 1
        )
        values["deepspeed_config.gradient_clipping"] = ds("gradient_clipping", "Gradient clipping (max norm)?", 1.0)
    return values
