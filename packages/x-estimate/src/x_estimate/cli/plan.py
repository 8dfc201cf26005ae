"""``--plan`` from the command line's options: the skeleton, its simulations, the printed plan."""

from __future__ import annotations

import json
from typing import Any

import click

from x_common.sizes import format_size
from x_estimate.plan.report import plan_dict, plan_text
from x_estimate.plan.search import MARGIN, Plan, make_plan

__all__ = ["check_plan_options", "run_plan"]


def check_plan_options(kw: dict[str, Any]) -> None:
    """Refuse, as a usage error, what --plan lacks or would have to override."""
    if not kw["plan"]:
        raise click.UsageError("--write-config writes the cheapest row of a plan: add --plan")
    target = kw["write_config"]
    if target is not None and target.exists() and not kw["overwrite"]:
        raise click.UsageError(f"--write-config {target}: the file exists; pass --overwrite to replace it")
    if target is not None and not target.parent.is_dir():
        raise click.UsageError(f"--write-config {target}: the folder {target.parent} does not exist")
    if kw["seq_len"] is None:
        raise click.UsageError("--plan needs --seq-len N: the tokens per sequence you train on")
    if kw["gpu_memory"] is None and kw["fits"] is None:
        raise click.UsageError("--plan needs --gpu-memory SIZE: each GPU's memory, e.g. 80GiB")
    chosen = [
        flag
        for flag, given in (
            ("--shard", kw["shard"] != "none"),
            ("--activation-checkpointing", kw["activation_checkpointing"]),
            ("--method formula", kw["method"] == "formula"),
            ("--device cpu", kw["device"] == "cpu"),
            ("--dtypes", bool(kw["dtypes"])),
        )
        if given
    ]
    if chosen:
        raise click.UsageError(
            f"--plan chooses what {', '.join(chosen)} would fix (it simulates CUDA steps of every setting); "
            "drop it, or give --precision to fix the precision"
        )


def run_plan(model: str, summary: Any, origin: str, source: Any, kw: dict[str, Any]) -> tuple[str, str | None]:
    """The plan's table (or JSON) for ``model``, and why no config was written when one was asked
    for and nothing fits (else None); ``kw`` are the command's options."""
    from x_estimate.model.errors import EstimateError
    from x_estimate.model.layers import gathered_parameters
    from x_estimate.model.source import resolve_source
    from x_estimate.simulate.error import SimulationError

    skeleton: Any = None

    def simulate(precision: str, checkpointing: bool, micro_batch: int) -> Any:
        nonlocal skeleton
        from x_estimate.simulate.step import simulate_training

        if skeleton is None:
            from x_estimate.model.skeleton import build_skeleton

            src = source if source is not None else resolve_source(model, kw["library_name"], token=kw["token"])
            skeleton = build_skeleton(src, base_model=kw["base_model"], trust_remote_code=kw["trust_remote_code"])
        try:
            return simulate_training(
                skeleton.model,
                skeleton.config,
                precision=precision,
                optimizer=kw["optimizer"],
                batch_size=micro_batch,
                seq_len=kw["seq_len"],
                checkpointing=checkpointing,
                attn_implementation=kw["attn_implementation"],
                free_outputs=kw["free_outputs"],
                device="cuda",
            )
        except SimulationError as exc:
            raise EstimateError(f"--plan simulates every setting, and this one cannot run: {exc}") from None

    unit, unit_params = gathered_parameters(summary)
    precisions = ("mixed-bf16", "bf16") if kw["precision"] == "auto" else (kw["precision"],)
    plan = make_plan(
        summary.tensors,
        simulate=simulate,
        gpus=kw["num_gpus"],
        gpu_memory=kw["gpu_memory"] if kw["gpu_memory"] is not None else kw["fits"],
        batch_size=kw["batch_size"],
        seq_len=kw["seq_len"],
        optimizer=kw["optimizer"],
        precisions=precisions,
        unit_params=unit_params,
    )
    notes = _notes(plan, kw, unit)
    title = (
        f"Training plan for `{model}`: {summary.class_name} ({summary.library}; from {origin}), "
        f"{summary.parameters:,} trainable parameters"
    )
    target, failure = kw["write_config"], None
    if target is not None and plan.rows:
        from x_estimate.plan.config import config_text, write_config

        present = set(summary.modules.values())
        wrap = [name for name in dict.fromkeys(summary.no_split) if name in present]
        text = config_text(plan, plan.rows[0], model=model, title=title, wrap=wrap, path=target)
        write_config(target, text, overwrite=kw["overwrite"])
        notes.append(f"Row 1 written to {target} as a launch config: x-launch --config_file {target} your_script.py")
    elif target is not None:
        failure = f"nothing fits {plan.gpus} x {format_size(plan.gpu_memory)}: no config written to {target}"
    if kw["as_json"]:
        found = plan_dict(plan, model=model, parameters=summary.parameters, notes=notes)
        found["config_file"] = str(target) if target is not None and plan.rows else None
        return json.dumps(found, indent=2), failure
    return plan_text(plan, title=title, notes=notes), failure


def _notes(plan: Plan, kw: dict[str, Any], unit: str) -> list[str]:
    loop = "outputs dropped before backward (--free-outputs)" if kw["free_outputs"] else "outputs kept through backward"
    notes = [
        "Each row: a setting's largest micro-batch (a divisor of --batch-size) that fits, the rest of the batch by "
        "gradient accumulation. Cheapest first: no offload, mixed precision before pure bf16, no activation "
        "checkpointing, zero3 last of the stages, fewest accumulation steps, lower stage; a row is listed only "
        "where every row above it costs more in one of these respects.",
        f"Figures: one GPU's simulated CUDA step (a real {plan.optimizer} step of the model on fake tensors; "
        f"{loop}; the caching allocator's reserved memory), replayed with the row's parts divided over "
        f"{plan.gpus} GPU{'s' if plan.gpus > 1 else ''} or moved to the CPU. A row fits when reserved leaves "
        f"{format_size(MARGIN)} free for the CUDA context and NCCL's buffers, which torch's allocator does not see.",
        "Sharding: zero1 divides the optimizer state, zero2 also the gradients, zero3 also the weights and gathers "
        f"units as it computes them, holding {unit} at once; reserved replays the step's allocations at "
        "their shard's size through the allocator model, the optimizer step's temporaries divided as its state; "
        "communication buckets are not counted.",
        "mixed-bf16: autocast over float32 weights (16 bytes per parameter of state with AdamW); bf16: bfloat16 "
        "weights, gradients and AdamW state, no float32 copy (8 bytes; updates below bfloat16's resolution are lost).",
    ]
    if any(r.setting.offload != "none" for r in [*plan.rows, *([plan.nearest] if plan.nearest else [])]):
        notes.append(
            "Offload optimizer: the float32 master, gradients and AdamW state in CPU memory, the GPU keeping 16-bit "
            "weights and gradients (DeepSpeed ZeRO-Offload); params: weights too, the GPU holding the unit being "
            "computed and its gradients. CPU per GPU: what each GPU's process keeps in host memory."
        )
    return notes
