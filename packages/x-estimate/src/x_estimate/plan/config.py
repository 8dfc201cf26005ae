"""``--plan --write-config FILE``: the plan's cheapest row as the launch config x-launch runs.

The file is an Accelerate-style YAML config (the keys ``accelerate config`` writes and
``x-launch --config_file`` reads): processes, precision, accumulation, the sharding strategy
with its offload and, under FSDP, activation checkpointing; a tensor-parallel or HSDP row's
Accelerate ParallelismConfig as the ``parallelism_config`` section (``parallelism_config_tp_size``
and its siblings, the keys ``accelerate config`` writes), beside FSDP2, which
``accelerate launch`` requires for any ParallelismConfig. Accelerate loads it too, except
where accumulation is needed outside DeepSpeed: its files have no key for that, x-launch's do. What no launcher setting controls
(the DataLoader's batch size; activation checkpointing outside FSDP; pure bf16 weights) is said
in the header's comments, beside the plan's simulated figures, so the file documents itself.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from x_common.sizes import format_size
from x_estimate.plan.report import TP_COST
from x_estimate.plan.search import Plan, PlanRow, Setting

__all__ = ["config_text", "launch_settings", "write_config"]

_MIXED = {"mixed-bf16": "bf16", "mixed-fp16": "fp16"}
_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")


def launch_settings(setting: Setting, gpus: int, wrap: list[str], machines: int = 1) -> dict[str, Any]:
    """The config's keys for ``setting`` on ``gpus`` processes of ``machines`` machines.

    ``wrap``: the block classes FSDP shards as units (the model's ``_no_split_modules`` found in
    it), as the plan counted them; none: the model is one unit.

    Example:
        >>> from x_estimate.plan.search import Setting
        >>> tp = Setting("mixed-bf16", "zero3", "none", False, 1, 1, tp=2)
        >>> launch_settings(tp, 8, ["LlamaDecoderLayer"])["parallelism_config"]["parallelism_config_tp_size"]
        2
    """
    parallel = setting.tp > 1 or setting.dp_replicate > 1
    deepspeed = setting.offload == "optimizer" or setting.shard == "zero1"
    fsdp = parallel or (not deepspeed and (setting.shard in ("zero2", "zero3") or setting.offload == "params"))
    distributed = "DEEPSPEED" if deepspeed else "FSDP" if fsdp else "MULTI_GPU" if gpus > 1 else "NO"
    # Pure bf16 casts the model in the script; DeepSpeed needs its bf16 mode on for bfloat16 weights.
    precision = _MIXED.get(setting.precision, "bf16" if deepspeed else "no")
    settings: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed,
        "num_machines": machines,
        "machine_rank": 0,
        "num_processes": gpus,
        "use_cpu": False,
        "mixed_precision": precision,
    }
    # Accelerate's files hold accumulation only in deepspeed_config (its config loader refuses the key
    # at the top): written at the top only where it is needed, x-launch reading it there.
    if setting.accumulation > 1 and not deepspeed:
        settings["gradient_accumulation_steps"] = setting.accumulation
    if fsdp:
        settings["fsdp_config"] = {
            "fsdp_version": 2,
            # zero2 is FSDP's SHARD_GRAD_OP: the weights stay gathered from forward to backward.
            "fsdp_reshard_after_forward": setting.shard == "zero3" or setting.offload == "params",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP" if wrap else "NO_WRAP",
            **({"fsdp_transformer_layer_cls_to_wrap": ",".join(wrap)} if wrap else {}),
            "fsdp_offload_params": setting.offload == "params",
            "fsdp_activation_checkpointing": setting.checkpointing,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
    if parallel:
        # Accelerate's keys (commands/config/cluster.py); accelerate launch turns the section on when it is
        # not empty, x-launch too, and both build the device mesh from it.
        sizes = {**setting.parallelism(gpus), "cp_size": 1}
        settings["parallelism_config"] = {f"parallelism_config_{key}": sizes[key] for key in _SIZES}
    if deepspeed:
        stage = 1 if setting.shard == "zero1" else int(setting.shard[-1])
        settings["deepspeed_config"] = {
            "zero_stage": stage,
            "offload_optimizer_device": "cpu" if setting.offload == "optimizer" else "none",
            "offload_param_device": "none",
            "gradient_accumulation_steps": setting.accumulation,
            "zero3_init_flag": stage == 3,
        }
    return settings


def _script_notes(setting: Setting, fsdp: bool) -> list[str]:
    notes = [f"DataLoader(batch_size={setting.micro_batch}): sequences per process per micro-batch"]
    if setting.tp > 1:
        notes.append(
            "accelerator.prepare(model) splits the model by its own tp_plan (transformers' base_model_tp_plan)"
        )
    if setting.precision == "bf16":
        notes.append("model.to(torch.bfloat16): pure bf16 weights and optimizer state, no float32 copy")
    if setting.checkpointing and not fsdp:
        notes.append("model.gradient_checkpointing_enable(): outside FSDP no launcher setting turns it on")
    return notes


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    # YAML 1.1 reads these bare words as booleans or null: Accelerate writes mixed_precision: 'no'.
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.,/-]*", text) and text.lower() not in {
        "no", "yes", "on", "off", "true", "false", "null", "y", "n",
    }  # fmt: skip
    return text if plain else "'" + text.replace("'", "''") + "'"


def _yaml(settings: dict[str, Any]) -> list[str]:
    lines = []
    for key, value in settings.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return lines


def config_text(plan: Plan, row: PlanRow, *, model: str, title: str, wrap: list[str], path: Path) -> str:
    """The file's text: the plan's figures as comments, then the launch settings."""
    # The installed distribution's version, which is _version.py's (test_cli checks they agree): a
    # module in a folder imports no private module of the package's top level.
    version = importlib.metadata.version("x-estimate")
    s = row.setting
    settings = launch_settings(s, plan.gpus, wrap, plan.machines)
    offload = "none" if s.offload == "none" else s.offload
    header = [
        f"Launch config for `{model}` written by x-estimate {version} --plan: its row 1, the cheapest "
        "setting that fits.",
        title,
        f"{plan.gpus} x {format_size(plan.gpu_memory)} GPU{'s' if plan.gpus > 1 else ''}; {plan.batch_size} x "
        f"{plan.seq_len} tokens per GPU per optimizer step; {plan.optimizer}.",
        f"Setting: {s.precision}, sharding {s.layout(plan.gpus)}, offload {offload}, activation checkpointing "
        f"{'on' if s.checkpointing else 'off'}, micro-batch {s.micro_batch} x {s.accumulation} accumulation steps.",
        f"Simulated per GPU: allocated {format_size(row.allocated)}, reserved {format_size(row.reserved)}, "
        f"headroom {format_size(row.headroom)} ({100 * row.headroom / plan.gpu_memory:.0f}%)"
        + (f", CPU memory {format_size(row.host)}" if row.host else "")
        + ".",
        "In the script: " + "; ".join(_script_notes(s, "fsdp_config" in settings)) + ".",
        *([f"TP: {TP_COST}."] if s.tp > 1 else []),
        f"All {plan.gpus} processes on one machine; for several, set num_machines, machine_rank and "
        "main_process_ip (or launch under SLURM)."
        if plan.machines == 1
        else f"{plan.gpus} processes on {plan.machines} machines: set machine_rank and main_process_ip on each "
        "(or launch under SLURM).",
        f"Run: x-launch --config_file {path} your_script.py",
    ]
    return "\n".join([*(f"# {line}" for line in header), *_yaml(settings)]) + "\n"


def write_config(path: Path, text: str, *, overwrite: bool) -> None:
    """Write ``text`` to ``path`` whole or not at all; an existing file is replaced only with ``overwrite``."""
    folder = path.parent if str(path.parent) else Path(".")
    handle, staged = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        if overwrite:
            os.replace(staged, path)
        else:
            try:
                os.link(staged, path)  # fails if the file appeared meanwhile: never replaces a user's file
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links: create it exclusively instead
                with open(path, "x") as stream:
                    stream.write(text)
    finally:
        Path(staged).unlink(missing_ok=True)
