"""``--plan`` from the command line's options: the skeleton, its simulations, the printed plan."""

from __future__ import annotations

import json
from typing import Any

import click

from x_common.sizes import format_size
from x_estimate.plan.report import TP_COST, plan_dict, plan_text
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
    if kw["num_gpus"] % kw["num_machines"]:
        raise click.UsageError(
            f"--num-machines {kw['num_machines']} does not divide --gpus {kw['num_gpus']}: give the GPUs of all machines"
        )
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
    from x_estimate.model.skeleton import build_skeleton
    from x_estimate.model.source import resolve_source
    from x_estimate.simulate.error import SimulationError

    src = source if source is not None else resolve_source(model, kw["library_name"], token=kw["token"])
    skeleton = build_skeleton(src, base_model=kw["base_model"], trust_remote_code=kw["trust_remote_code"])
    ranks, tp_notes = _tensor_parallel(skeleton, kw)

    def simulate(precision: str, checkpointing: bool, micro_batch: int, tp: int) -> Any:
        from x_estimate.simulate.step import simulate_training

        held = skeleton if tp == 1 else ranks[tp][0]
        try:
            return simulate_training(
                held.model,
                held.config,
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
            where = "" if tp == 1 else f" (one rank of tp={tp})"
            raise EstimateError(f"--plan simulates every setting, and this one{where} cannot run: {exc}") from None

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
        machines=kw["num_machines"],
        tp_units={tp: params for tp, (_, params) in ranks.items()},
    )
    notes = _notes(plan, kw, unit) + tp_notes
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


def _tensor_parallel(skeleton: Any, kw: dict[str, Any]) -> tuple[dict[int, tuple[Any, int]], list[str]]:
    """{TP degree: (one rank's skeleton, its zero3 unit's parameters)} for each degree the model's
    plan splits evenly within a machine, and the notes that say what was searched and why not more."""
    from x_estimate.model.layers import gathered_parameters
    from x_estimate.model.summary import summarize
    from x_estimate.model.tensor_parallel import tp_degrees, tp_local

    per_machine = kw["num_gpus"] // kw["num_machines"]
    if per_machine == 1:
        return {}, []
    degrees, refused = tp_degrees(skeleton.model, skeleton.config, per_machine)
    ranks = {}
    for tp in degrees:
        local = tp_local(skeleton, tp)
        ranks[tp] = (local, gathered_parameters(summarize(local, measure_kv=False))[1])
    where = f"{per_machine} GPUs" + (" per machine" if kw["num_machines"] > 1 else "")
    if degrees:
        searched = ", ".join(map(str, degrees))
        notes = [
            f"Tensor parallelism: tp in {{{searched}}} (dividing {where}, the attention and key-value heads and "
            "every dimension the model's TP plan splits); a TP row's figures are the simulated step of the model "
            "one TP rank holds (colwise layers' outputs, rowwise layers' inputs, the vocabulary and the heads "
            "divided by tp; the all-reduced outputs and input gradients, and the gathered logits, allocated "
            f"where the collectives allocate them), FSDP2 dividing it over dp_shard = gpus / tp. {TP_COST}."
        ]
    else:
        notes = [f"Tensor parallelism over {where}: none searched."]
    if refused:
        notes.append("No TP rows for " + "; ".join(refused) + ".")
    return ranks, notes


def _notes(plan: Plan, kw: dict[str, Any], unit: str) -> list[str]:
    loop = "outputs dropped before backward (--free-outputs)" if kw["free_outputs"] else "outputs kept through backward"
    notes = [
        "Each row: a setting's largest micro-batch (a divisor of --batch-size) that fits, the rest of the batch by "
        "gradient accumulation. Cheapest first: no offload, lower TP degree, mixed precision before pure bf16, no "
        "activation checkpointing, weight gathers (zero3, FSDP2) last of the stages and within a machine before "
        "across machines, fewest accumulation steps, lower stage; a row is listed only where every row above it "
        "costs more in one of these respects.",
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
    if kw["num_machines"] > 1:
        per = plan.gpus // kw["num_machines"]
        notes.append(
            f"HSDP dp_replicate={kw['num_machines']} dp_shard={per}: each machine holds a whole sharded copy (its "
            f"memory is FSDP's over {per} GPUs) and only the gradients' all-reduce between replicas crosses machines."
        )
    else:
        notes.append("HSDP (dp_replicate x dp_shard) is searched with --num-machines M > 1, one replica per machine.")
    if any(r.setting.offload != "none" for r in [*plan.rows, *([plan.nearest] if plan.nearest else [])]):
        notes.append(
            "Offload optimizer: the float32 master, gradients and AdamW state in CPU memory, the GPU keeping 16-bit "
            "weights and gradients (DeepSpeed ZeRO-Offload); params: weights too, the GPU holding the unit being "
            "computed and its gradients. CPU per GPU: what each GPU's process keeps in host memory."
        )
    return notes
