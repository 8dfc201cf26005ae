"""A ``Plan`` as the table x-estimate prints, or as JSON, with how to run its cheapest row."""

from __future__ import annotations

from typing import Any

from x_common.sizes import format_size
from x_estimate.plan.search import MARGIN, Plan, PlanRow, Setting

__all__ = ["TP_COST", "how_to_run", "launch_flags", "plan_dict", "plan_text"]

_SHARD_CONFIG = {
    "zero1": "DeepSpeed ZeRO stage 1",
    "zero2": "FSDP SHARD_GRAD_OP (or DeepSpeed ZeRO stage 2)",
    "zero3": "FSDP FULL_SHARD (or DeepSpeed ZeRO stage 3)",
}
_MIXED = {"mixed-bf16": "bf16", "mixed-fp16": "fp16"}
TP_COST = (
    "TP costs an all-reduce of the block's activations per attention and per MLP block, in forward and again in "
    "backward (4 per layer per micro-batch, on the critical path): keep tp within a machine's NVLink"
)


def launch_flags(setting: Setting, gpus: int, machines: int = 1) -> str:
    """The x-launch (and accelerate launch) command line of a TP or HSDP row."""
    flags = [f"--num_processes {gpus}"]
    if machines > 1:
        flags.append(f"--num_machines {machines}")
    flags += [f"--mixed_precision {_MIXED.get(setting.precision, 'no')}", "--use_parallelism_config"]
    flags += [f"--parallelism_config_{key} {value}" for key, value in setting.parallelism(gpus).items() if value > 1]
    return "x-launch " + " ".join(flags) + " your_script.py"


def how_to_run(setting: Setting, gpus: int, machines: int = 1) -> str:
    """The row as x-runtime (and Accelerate) settings."""
    s = setting
    accelerator = [f"mixed_precision={_MIXED.get(s.precision, 'no')!r}"]
    if s.accumulation > 1:
        accelerator.append(f"gradient_accumulation_steps={s.accumulation}")
    if s.tp > 1 or s.dp_replicate > 1:
        sizes = ", ".join(f"{k}={v}" for k, v in s.parallelism(gpus).items() if v > 1)
        accelerator.append(f"parallelism_config=ParallelismConfig({sizes})")
    parts = [f"Accelerator({', '.join(accelerator)})", f"DataLoader(batch_size={s.micro_batch})"]
    if s.precision == "bf16":
        parts.insert(0, "model.to(torch.bfloat16)")
    if s.tp > 1:
        parts.append("prepare() splits the model by its own tp_plan")
    if s.tp > 1 or s.dp_replicate > 1:
        if s.checkpointing:
            parts.append("model.gradient_checkpointing_enable()")
        parts.append(f"{s.layout(gpus)}: {launch_flags(s, gpus, machines)}")
        return ", ".join(parts)
    if s.offload == "optimizer":
        parts.append(f"DeepSpeed ZeRO stage {s.shard[-1]} with offload_optimizer_device: cpu")
    elif s.offload == "params":
        parts.append("FSDP FULL_SHARD with fsdp_offload_params: true (or DeepSpeed ZeRO stage 3 with "
                     "offload_param_device and offload_optimizer_device: cpu)")  # fmt: skip
    elif s.shard != "none":
        parts.append(_SHARD_CONFIG[s.shard])
    elif gpus > 1:
        parts.append("DDP (x-launch --multi_gpu)")
    if s.checkpointing:
        parts.append("model.gradient_checkpointing_enable()")
    return ", ".join(parts)


def _headroom(row: PlanRow, plan: Plan) -> str:
    return f"{format_size(row.headroom)} ({100 * row.headroom / plan.gpu_memory:.0f}%)"


def _cells(index: str, row: PlanRow, plan: Plan) -> list[str]:
    s = row.setting
    return [
        index,
        s.precision,
        s.layout(plan.gpus),
        "-" if s.offload == "none" else s.offload,
        "yes" if s.checkpointing else "no",
        f"{s.micro_batch} x {s.accumulation}",
        format_size(row.allocated),
        format_size(row.reserved),
        _headroom(row, plan),
        format_size(row.host) if row.host else "-",
    ]


def _markdown(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *[line(r) for r in rows]]


_HEADERS = [
    "#", "precision", "sharding", "offload", "act. ckpt", "micro-batch x accum.", "allocated", "reserved",
    "headroom", "CPU per GPU",
]  # fmt: skip


def plan_text(plan: Plan, *, title: str, notes: list[str]) -> str:
    lines = [
        title,
        f"{plan.gpus} x {format_size(plan.gpu_memory)} GPU{'s' if plan.gpus > 1 else ''}; "
        f"{plan.batch_size} x {plan.seq_len} tokens per GPU per optimizer step; {plan.optimizer}; "
        f"{plan.simulations} simulated CUDA steps",
    ]
    if plan.rows:
        lines += _markdown(_HEADERS, [_cells(str(i), r, plan) for i, r in enumerate(plan.rows, 1)])
        lines.append(f"Cheapest that fits (row 1): {how_to_run(plan.rows[0].setting, plan.gpus, plan.machines)}.")
    else:
        lines.append(f"Nothing fits in {format_size(plan.usable)} per GPU ({format_size(MARGIN)} kept free).")
        if plan.nearest is not None:
            near = plan.nearest
            lines += _markdown(_HEADERS, [_cells("-", near, plan)])
            lines.append(
                f"The setting needing least reserves {format_size(near.reserved)} per GPU, "
                f"{format_size(near.reserved - plan.usable)} too many: more GPUs, a bigger GPU, or a shorter "
                "--seq-len."
            )
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def plan_dict(plan: Plan, *, model: str, parameters: int, notes: list[str]) -> dict[str, Any]:
    return {
        "model": model,
        "parameters": parameters,
        "gpus": plan.gpus,
        "gpu_memory_bytes": plan.gpu_memory,
        "kept_free_bytes": MARGIN,
        "batch_size": plan.batch_size,
        "seq_len": plan.seq_len,
        "optimizer": plan.optimizer,
        "precisions": list(plan.precisions),
        "simulations": plan.simulations,
        "machines": plan.machines,
        "tp_degrees": list(plan.tp_degrees),
        "rows": [_row_dict(r, plan) for r in plan.rows],
        "fits": bool(plan.rows),
        "nearest": plan.nearest.as_dict() if plan.nearest is not None else None,
        "notes": notes,
    }


def _row_dict(row: PlanRow, plan: Plan) -> dict[str, Any]:
    s = row.setting
    found = {**row.as_dict(), "layout": s.layout(plan.gpus), "how": how_to_run(s, plan.gpus, plan.machines)}
    found["dp_shard"] = s.dp_shard(plan.gpus)
    if s.tp > 1:
        found["note"] = TP_COST
    return found
