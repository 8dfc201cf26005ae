"""The lines under the table that explain the Training column: one per row, then the notes."""

from __future__ import annotations

from typing import Any

from x_common.sizes import format_size

__all__ = ["breakdown_lines", "training_notes"]

_NAMES = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "master": "fp32 master",
    "activations": "activations",
    "logits": "logits",
    "temporaries": "temporaries",
    "gathered_layer": "gathered layer",
}


def _simulated(row: Any) -> str:
    p = row.peak
    parts = " + ".join(f"{_NAMES[k]} {format_size(v)}" for k, v in p.at_peak.items() if v)
    where = f", peak in {p.phase}" if p.phase else ""
    steady = f"; steady state {format_size(p.steady)}" if p.steady is not None else ""
    return f"  {row.dtype} ({row.training.precision}, simulated{where}): {parts} = {format_size(p.peak)}{steady}"


def _formula(row: Any) -> str:
    t = row.training
    parts = f"weights {format_size(t.weights)} + gradients {format_size(t.gradients)} + optimizer state {format_size(t.optimizer_state)}"
    if t.master:
        parts += f" + fp32 master {format_size(t.master)}"
    if t.gathered_layer:
        parts += f" + gathered layer {format_size(t.gathered_layer)}"
    return f"  {row.dtype} ({t.precision}): {parts} = {format_size(t.total)} ({t.bytes_per_param:.2f} B/param)"


def breakdown_lines(rows: list[Any]) -> list[str]:
    out = []
    for r in rows:
        if r.training is None:
            continue
        out.append(_simulated(r) if r.peak is not None and r.peak.method == "simulate" else _formula(r))
    return out


def training_notes(options: Any, rows: list[Any], simulations: Any) -> list[str]:
    """How the Training column was obtained, and why the formulas were used where they were."""
    notes = []
    simulated = [r for r in rows if r.peak is not None and r.peak.method == "simulate"]
    if simulated:
        attn = options.attn_implementation or "transformers' default"
        ckpt = "with" if options.activation_checkpointing else "without"
        loop = (
            "loss = model(**batch).loss: outputs dropped before backward"
            if getattr(options, "free_outputs", False)
            else "outputs = model(**batch); loss = outputs.loss: outputs kept through backward; --free-outputs drops them"
        )
        notes.append(
            f"Training peak: simulated (a real {options.optimizer} step on fake tensors, after an optimizer step "
            f"that creates its state: forward, loss, backward, optimizer step, zero_grad; {options.batch_size} x "
            f"{options.seq_len} tokens; attention {attn}; {ckpt} activation checkpointing; {loop}); the breakdown "
            "is what is live at the peak, the steady state what stays between steps. --method formula for the formulas."
        )
        if options.shard != "none" and options.num_gpus > 1:
            notes.append(
                f"Per device: the simulated step replayed with {options.shard}'s parts divided over "
                f"{options.num_gpus} devices (zero1 optimizer state, zero2 also gradients, zero3/fsdp also "
                "weights plus one gathered unit); communication buffers are not counted."
            )
        if getattr(options, "device", "cpu") == "cuda":
            notes.append(
                "Device: the step a CUDA GPU (sm80+) runs: SDPA's flash / memory-efficient / math choice, CUDA "
                "autocast's casts, native dropout, AdamW's foreach step, cuBLAS workspaces, 512-byte blocks. "
                "Reserved (CUDA): the caching allocator's segments after a second step, from a model of the "
                "allocator (rounding, 2 MiB / 20 MiB segments, best fit, splits); --fits compares it"
                + (
                    "; per device under sharding: the step's allocations replayed at their shard's size, the "
                    "optimizer step's temporaries divided as its state, a gathered unit as one more segment"
                    if options.shard != "none" and options.num_gpus > 1
                    else ""
                )
                + "."
            )
        for note in dict.fromkeys(n for r in simulated for n in r.peak.notes):
            notes.append(f"Simulated step: {note}.")
    if simulations is not None and simulations.reason:
        notes.append(f"Training: formulas, because the step could not be simulated: {simulations.reason}.")
    return notes
