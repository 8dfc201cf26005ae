"""From a skeleton to the rows x-estimate prints, as text or JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from x_common.module_sizes import sizes_of
from x_common.sizes import format_size
from x_estimate.model.inference import activation_bytes, kv_cache_bytes
from x_estimate.model.layers import gathered_parameters, largest_unit, placement_units
from x_estimate.model.quantized import quantized_sizes
from x_estimate.model.summary import ModelSummary
from x_estimate.report.training_text import breakdown_lines, training_notes
from x_estimate.simulate.rows import Simulations
from x_estimate.training.memory import TrainingMemory, training_memory
from x_estimate.training.peak import PeakFigures, formula_peak, gathered_bytes, simulated_peak

__all__ = ["DTYPES", "Options", "Report", "Row", "build_report", "row_precisions"]

DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
_ROW_PRECISION = {"float32": "fp32", "float16": "mixed-fp16", "bfloat16": "mixed-bf16"}
_VALUE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 2, "int4": 2}  # KV cache stays 16-bit


@dataclass(frozen=True)
class Options:
    dtypes: tuple[str, ...] = DTYPES
    optimizer: str = "adamw"
    precision: str = "auto"
    int4: str = "nf4"
    num_gpus: int = 1
    shard: str = "none"
    seq_len: int | None = None
    batch_size: int = 1
    fits: int | None = None
    method: str = "formula"  # what the CLI resolved --method to: "simulate" or "formula"
    attn_implementation: str | None = None
    activation_checkpointing: bool = False
    free_outputs: bool = False  # the simulated loop drops the model's outputs before backward
    device: str = "cpu"  # whose kernels the simulated step runs: "cpu", or "cuda" (with reserved figures)


@dataclass
class Row:
    dtype: str
    largest_name: str
    largest: int
    total: int
    training: TrainingMemory | None
    kv_cache: int | None = None
    activations: int | None = None
    activations_checkpointed: int | None = None
    quantized_weights: int = 0
    peak: PeakFigures | None = None

    def inference_total(self) -> int:
        return self.total + (self.kv_cache or 0)

    def training_total(self, *, checkpointing: bool = False) -> int | None:
        """The formula's sum: state plus activations (with or without checkpointing)."""
        if self.training is None:
            return None
        activations = self.activations_checkpointed if checkpointing else self.activations
        return self.training.total + (activations or 0)


@dataclass
class Report:
    model: str
    library: str
    class_name: str
    origin: str
    note: str
    parameters: int
    rows: list[Row]
    options: Options
    assumptions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        opts = self.options
        return {
            "model": self.model,
            "library": self.library,
            "class": self.class_name,
            "source": self.origin,
            "parameters": self.parameters,
            "options": {
                "optimizer": opts.optimizer,
                "precision": opts.precision,
                "int4_format": opts.int4,
                "num_gpus": opts.num_gpus,
                "shard": opts.shard,
                "seq_len": opts.seq_len,
                "batch_size": opts.batch_size,
                "fits": opts.fits,
                "method": opts.method,
                "attn_implementation": opts.attn_implementation,
                "activation_checkpointing": opts.activation_checkpointing,
                "free_outputs": opts.free_outputs,
                "device": opts.device,
            },
            "rows": [
                {
                    "dtype": r.dtype,
                    "largest_layer": {"name": r.largest_name, "bytes": r.largest},
                    "total_bytes": r.total,
                    "training": _training_dict(r),
                    "kv_cache_bytes": r.kv_cache,
                    "activation_bytes": r.activations,
                    "activation_bytes_checkpointed": r.activations_checkpointed,
                    "fits": _fits(r, opts.fits),
                }
                for r in self.rows
            ],
            "assumptions": self.assumptions,
        }

    def as_text(self) -> str:
        opts = self.options
        lines = [
            f"Memory for `{self.model}`: {self.class_name} ({self.library}, {self.note}; from {self.origin})",
            f"{self.parameters:,} trainable parameters",
        ]
        simulated = any(r.peak is not None and r.peak.method == "simulate" for r in self.rows)
        what = f"Training peak ({opts.optimizer}, simulated" if simulated else f"Training ({opts.optimizer}"
        headers = ["dtype", "Largest Layer", "Total Size", what + ")"]
        if opts.shard != "none":
            headers[-1] = f"{what}, per device, {opts.shard} over {opts.num_gpus})"
        elif opts.num_gpus > 1:
            headers[-1] = f"{what}, per device, data parallel over {opts.num_gpus})"
        reserved = any(r.peak is not None and r.peak.reserved is not None for r in self.rows)
        if reserved:  # the CUDA simulation's second figure: what the caching allocator holds
            headers.append("Reserved (CUDA)")
        if opts.seq_len is not None:
            # A simulated step has one activation figure, for the checkpointing it ran with.
            act = "Activations max (ckpt)" if opts.activation_checkpointing else "Activations max"
            headers += ["KV cache", act] if simulated else ["KV cache", "Activations", "Activations (ckpt)"]
        if opts.fits is not None:
            headers += [f"Fits {format_size(opts.fits)}"]
        table = []
        for r in self.rows:
            cells = [r.dtype, format_size(r.largest), format_size(r.total)]
            if r.training is None:
                cells.append("-")
            elif r.peak is not None and r.peak.method == "simulate":
                cells.append(format_size(r.peak.peak))
            else:
                cells.append(format_size(r.training.total))
            if reserved:
                cells.append(_opt_size(r.peak.reserved if r.peak is not None else None))
            if opts.seq_len is not None:
                if simulated:
                    sim = r.peak if r.peak is not None and r.peak.method == "simulate" else None
                    cells += [_opt_size(r.kv_cache), format_size(sim.activations) if sim is not None else "-"]
                else:
                    cells += [_opt_size(r.kv_cache), _opt_size(r.activations), _opt_size(r.activations_checkpointed)]
            if opts.fits is not None:
                fits = _fits(r, opts.fits)
                cell = f"load {'yes' if fits['inference'] else 'no'}, train {_yes_no(fits['training'])}"
                if fits["training"] is False and fits["training_checkpointed"]:
                    cell += " (yes with activation checkpointing)"
                cells.append(cell)
            table.append(cells)
        lines += _markdown(headers, table)
        names = {r.largest_name for r in self.rows}
        if len(names) == 1:
            lines.append(f"Largest layer: {names.pop() or '(whole model)'}, the largest unit a device map keeps whole.")
        lines.append("Training breakdown:")
        lines += breakdown_lines(self.rows)
        lines += [f"- {a}" for a in self.assumptions]
        return "\n".join(lines)


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _opt_size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


def _fits(row: Row, budget: int | None) -> dict[str, bool | None]:
    if budget is None:
        return {"inference": None, "training": None, "training_checkpointed": None}
    if row.peak is not None and row.peak.method == "simulate":
        # One simulated step, with the checkpointing it ran with: no other figure to offer. On
        # CUDA a step fails when the allocator cannot reserve a segment: reserved is what must fit.
        need = row.peak.reserved if row.peak.reserved is not None else row.peak.peak
        return {
            "inference": row.inference_total() <= budget,
            "training": need <= budget,
            "training_checkpointed": None,
        }
    train, ckpt = row.training_total(), row.training_total(checkpointing=True)
    if row.peak is not None:
        train = row.peak.peak
    return {
        "inference": row.inference_total() <= budget,
        "training": None if train is None else train <= budget,
        "training_checkpointed": None if ckpt is None or row.activations_checkpointed is None else ckpt <= budget,
    }


def _markdown(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *[line(r) for r in rows]]


def row_precisions(options: Options) -> list[str]:
    """The training precisions the requested rows use, each once, in row order."""
    found = [
        options.precision if options.precision != "auto" else _ROW_PRECISION[d]
        for d in options.dtypes
        if d in _ROW_PRECISION
    ]
    return list(dict.fromkeys(found))


def build_report(
    summary: ModelSummary, *, name: str, origin: str, options: Options, simulations: Simulations | None = None
) -> Report:
    """Rows for every requested dtype, from the model's summary and, when given, simulated steps."""
    names = [n for t in summary.tensors for n in t.names]
    units = placement_units(summary.modules, names, summary.no_split)
    _, unit_params = gathered_parameters(summary)
    shape, can_generate = summary.attention, summary.can_generate
    rows = []
    for dtype in options.dtypes:
        quantized = 0
        if dtype in ("int8", "int4"):
            sizes, quantized = quantized_sizes(summary, "int8" if dtype == "int8" else options.int4)
        else:
            sizes = sizes_of(summary.tensors, dtype)
        largest_name, largest = largest_unit(sizes, units)
        precision = None  # training quantized weights (QLoRA trains adapters) is not modelled
        if dtype in _ROW_PRECISION:
            precision = options.precision if options.precision != "auto" else _ROW_PRECISION[dtype]
        training = None
        if precision is not None:
            training = training_memory(
                summary.tensors,
                precision=precision,
                optimizer=options.optimizer,
                num_devices=options.num_gpus,
                shard=options.shard,
                gathered_params=unit_params,
            )
        row = Row(dtype, largest_name, largest, sizes[""], training, quantized_weights=quantized)
        if options.seq_len is not None and shape is not None:
            inputs = {"seq_len": options.seq_len, "batch_size": options.batch_size}
            if can_generate:
                row.kv_cache = kv_cache_bytes(shape, **inputs, bytes_per_value=_VALUE_BYTES[dtype])
            if training is not None:
                act = 4 if training.precision == "fp32" else 2
                row.activations = activation_bytes(shape, **inputs, checkpointing=False, bytes_per_value=act)
                row.activations_checkpointed = activation_bytes(
                    shape, **inputs, checkpointing=True, bytes_per_value=act
                )
        if training is not None and precision is not None:
            row.peak = _peak(row, training, precision, options, simulations, unit_params)
        rows.append(row)
    assumptions = _assumptions(options, rows, shape, can_generate)
    assumptions += training_notes(options, rows, simulations)
    return Report(
        name, summary.library, summary.class_name, origin, summary.note, summary.parameters, rows, options, assumptions
    )


def _peak(
    row: Row,
    training: TrainingMemory,
    precision: str,
    options: Options,
    simulations: Simulations | None,
    unit_params: int,
) -> PeakFigures:
    step = simulations.steps.get(precision) if simulations is not None else None
    if step is not None:
        return simulated_peak(step, training, gathered_weight_bytes=gathered_bytes(unit_params, precision))
    acts = row.activations_checkpointed if options.activation_checkpointing else row.activations
    return formula_peak(training, acts if options.seq_len is not None else None)


def _training_dict(row: Row) -> dict[str, Any] | None:
    if row.training is None:
        return None
    return {**row.training.as_dict(), **(row.peak.as_dict() if row.peak is not None else {})}


def _assumptions(options: Options, rows: list[Row], shape: Any, can_generate: bool) -> list[str]:
    notes = [
        "Total Size: parameters and buffers, tied weights once; binary units (1 MiB = 2^20 bytes). "
        "Loading needs this much; running a forward pass needs more (activations, workspace).",
    ]
    if any(r.training and (r.peak is None or r.peak.method == "formula") for r in rows):
        how = (
            "per row: float32 -> fp32, float16 -> mixed-fp16, bfloat16 -> mixed-bf16"
            if options.precision == "auto"
            else options.precision
        )
        notes.append(
            f"Training: weights + gradients + optimizer state + fp32 master copy, summed ({how}); "
            "activations are extra (give --seq-len to estimate them)."
        )
    quant = [r for r in rows if r.dtype in ("int8", "int4")]
    if quant:
        fmt = {"int8": "int8 (LLM.int8, float32 row scales)", "int4": f"int4 ({options.int4})"}
        notes.append(
            "Quantized rows: only linear weights are quantized ("
            + ", ".join(f"{fmt[r.dtype]}: {r.quantized_weights} weights" for r in quant)
            + "); embeddings, norms, biases and the output head stay float16; block/group scales included."
        )
    simulated = any(r.peak is not None and r.peak.method == "simulate" for r in rows)
    if options.seq_len is not None:
        if shape is None:
            what = "KV cache" if simulated else "KV cache and activations"
            notes.append(f"{what}: not estimated (no attention shape in the config, or an encoder-decoder model).")
        else:
            if not can_generate:
                notes.append("KV cache: not a decoder-only model; no cache.")
            inputs = f"Inputs: {options.batch_size} x {options.seq_len} tokens. KV cache in the row's dtype (16-bit for int8/int4 rows)"
            if simulated:  # the activations come from the simulated step, not from a formula
                notes.append(inputs + ".")
            else:
                notes.append(
                    inputs + "; activations per Korthikanti et al. 2022 (16-bit, 32-bit for fp32 training; "
                    "attention scores kept: an upper bound with fused attention)."
                )
    return notes
