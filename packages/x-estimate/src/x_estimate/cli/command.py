"""The ``x-estimate`` command line.

Heavy imports (torch, transformers, timm) happen only after the arguments are valid, once.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from x_common import env
from x_estimate.cli.spellings import DTYPE_ALIASES, DtypeChoice, dashed_options, spread_multi_value
from x_estimate.model.quantized import INT4_FORMATS
from x_estimate.model.source import LIBRARIES
from x_estimate.report.table import DTYPES
from x_estimate.simulate.rows import METHODS
from x_estimate.training.memory import OPTIMIZERS, PRECISIONS, SHARDS

_SIZE_HELP = "a size such as 80GiB or 40GB"
ATTENTIONS = ("eager", "sdpa")
DEVICES = ("cpu", "cuda")


class _Size(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        from x_common.sizes import parse_size

        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}, no_args_is_help=True)
@click.argument("model")
@click.option(
    "--library_name",
    "--library-name",
    type=click.Choice(LIBRARIES),
    help="Library of MODEL (detected when omitted).",
)
@click.option(
    "--dtypes",
    multiple=True,
    type=DtypeChoice(DTYPES),
    help=f"Rows to print: any of {', '.join(DTYPES)} (default all); "
    f"{', '.join(DTYPE_ALIASES)} name {', '.join(DTYPE_ALIASES.values())}, as x-launch spells them.",
)
@click.option(
    "--trust_remote_code",
    "--trust-remote-code",
    is_flag=True,
    help="Run the model's own code from its repo (read it first).",
)
@click.option(
    "--base-model",
    is_flag=True,
    help="Build the bare AutoModel, without task head, as Accelerate does.",
)
@click.option(
    "--optimizer",
    type=click.Choice(OPTIMIZERS),
    default="adamw",
    show_default=True,
    help="Optimizer whose state training holds (adamw8bit: formula only).",
)
@click.option(
    "--precision",
    type=click.Choice(("auto", *PRECISIONS)),
    default="auto",
    show_default=True,
    help="Training precision; auto: float32 row fp32, float16 row mixed-fp16, bfloat16 row mixed-bf16.",
)
@click.option(
    "--int4",
    "int4",
    type=click.Choice(INT4_FORMATS),
    default="nf4",
    show_default=True,
    help="Format of the int4 row.",
)
@click.option(
    "--num-gpus",
    "--gpus",
    "num_gpus",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Devices training shares the model over.",
)
@click.option(
    "--shard",
    type=click.Choice(SHARDS),
    default="none",
    show_default=True,
    help="How training state is divided over --num-gpus devices (ZeRO stage or FSDP).",
)
@click.option(
    "--seq-len",
    type=click.IntRange(min=1),
    help="Tokens per sequence: adds KV cache and activations, and simulates a training step.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Sequences per step on each device.",
)
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="auto",
    show_default=True,
    help="Training figures: simulate a real step on fake tensors, or the formulas; auto simulates when --seq-len is given.",
)
@click.option(
    "--attn-implementation",
    type=click.Choice(ATTENTIONS),
    help="Attention kernel of the simulated step (default: what transformers picks).",
)
@click.option(
    "--activation-checkpointing",
    is_flag=True,
    help="Train with activation checkpointing (model.gradient_checkpointing_enable()).",
)
@click.option(
    "--free-outputs",
    is_flag=True,
    help="Simulate a loop that keeps only the loss (loss = model(**batch).loss); by default the "
    "model's outputs and logits stay alive through backward, as in outputs = model(**batch); loss = outputs.loss.",
)
@click.option(
    "--device",
    type=click.Choice(DEVICES),
    help="Whose kernels the simulated step runs: cuda (flash/efficient attention, CUDA autocast, cuBLAS "
    "workspaces, and the caching allocator's reserved memory) or cpu. Default: cuda with --fits, else cpu.",
)
@click.option("--fits", type=_Size(), help=f"Say which rows fit in this memory ({_SIZE_HELP}).")
@click.option(
    "--plan",
    is_flag=True,
    help="Find the cheapest training settings that fit --gpus GPUs of --gpu-memory each (precision, "
    "micro-batch and accumulation, activation checkpointing, ZeRO/FSDP stage, CPU offload, tensor-parallel "
    "degree and HSDP); needs --seq-len.",
)
@click.option("--gpu-memory", type=_Size(), help=f"Each GPU's memory for --plan ({_SIZE_HELP}).")
@click.option(
    "--num-machines",
    "num_machines",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --plan: the machines the --gpus are spread over, evenly; tensor parallelism stays within one "
    "machine and HSDP replicates over them.",
)
@click.option(
    "--write-config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --plan: write its cheapest row as a launch config for x-launch --config_file FILE.",
)
@click.option("--overwrite", is_flag=True, help="Let --write-config replace an existing file.")
@click.option(
    "--token",
    envvar=env.HF_TOKEN.name,
    help=f"Hugging Face token for gated or private repos (default: ${env.HF_TOKEN.name}).",
)
@click.option("--no-cache", is_flag=True, help="Rebuild the skeleton even if this config was estimated before.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="x-estimate", prog_name="x-estimate")
def _command(model: str, **kw: Any) -> None:
    """Print the memory MODEL needs, from its config alone (built on the meta device).

    MODEL is a folder holding config.json, a Hugging Face Hub id (only config.json is fetched,
    from the local cache when offline) or a timm model name.

    \b
    Examples:
      x-estimate ./my-model --dtypes float32 float16
      x-estimate meta-llama/Llama-3.1-8B --seq-len 8192 --fits 80GiB
      x-estimate resnet50 --library_name timm
      x-estimate gpt2 --num-gpus 8 --shard zero3 --precision mixed-bf16 --json
      x-estimate ./my-model --seq-len 2048 --batch-size 4 --method formula
      x-estimate ./my-model --seq-len 2048 --device cuda
      x-estimate meta-llama/Llama-3.1-8B --plan --gpus 8 --gpu-memory 80GiB --seq-len 8192 --batch-size 8
      x-estimate meta-llama/Llama-3.1-70B --plan --gpus 16 --num-machines 2 --gpu-memory 80GiB --seq-len 4096

    With --seq-len the Training column is a simulated training step (fake tensors, no data).
    Every dashed option also takes its underscore spelling (--seq_len, --batch_size, ...).
    """
    from x_estimate.model.errors import EstimateError

    if kw["method"] == "simulate" and kw["seq_len"] is None:
        raise click.UsageError("--method simulate needs --seq-len (a step needs inputs); add --seq-len N")
    if kw["num_machines"] != 1 and not kw["plan"]:
        raise click.UsageError("--num-machines spreads a --plan's GPUs over machines: add --plan")
    if kw["plan"] or kw["write_config"] is not None:
        from x_estimate.cli.plan import check_plan_options

        check_plan_options(kw)
    try:
        (_run_plan if kw["plan"] else _run)(model, **kw)
    except Exception as exc:
        if kw["debug"]:
            raise
        if isinstance(exc, EstimateError):
            click.echo(f"Error: {exc}", err=True)
        else:  # a bug, or a library failing in a way we did not foresee: still one line
            first = str(exc).splitlines()[0] if str(exc) else ""
            click.echo(f"Error: {type(exc).__name__}: {first} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)


def _summary(model: str, kw: dict[str, Any]) -> tuple[Any, str, Any, str | None]:
    """The model's summary, where it came from, its source (None for a cached timm name) and
    its cache key (None when not cached)."""
    from x_estimate.model import cache
    from x_estimate.model.source import ModelSource, resolve_source

    use_cache = not kw["no_cache"] and not kw["trust_remote_code"]
    bare = "/" not in model and not model.startswith((".", "~")) and not os.path.exists(model)
    if use_cache and bare and kw["library_name"] in (None, "timm"):
        # A timm registry name: answer from the cache before paying for importing timm.
        key = cache.summary_key(library="timm", config=None, timm_name=model, base_model=kw["base_model"])
        if (hit := cache.load_summary(key)) is not None:
            return hit, "timm registry", None, key
    source: ModelSource = resolve_source(model, kw["library_name"], token=kw["token"])
    key = cache.summary_key(
        library=source.library, config=source.config, timm_name=source.timm_name, base_model=kw["base_model"]
    )
    measure_kv = kw["seq_len"] is not None
    hit = cache.load_summary(key) if use_cache else None
    if hit is not None and (hit.kv_measured or not measure_kv):
        return hit, source.origin, source, key
    from x_estimate.model.skeleton import build_skeleton
    from x_estimate.model.summary import summarize

    skeleton = build_skeleton(source, base_model=kw["base_model"], trust_remote_code=kw["trust_remote_code"])
    summary = summarize(skeleton, measure_kv=measure_kv)
    if use_cache:
        cache.save_summary(key, summary)
    return summary, source.origin, source, key if use_cache else None


def _warn_long_sequence(source: Any, seq_len: int | None) -> None:
    config = (source.config if source is not None else None) or {}
    for cfg in (config, config.get("text_config") or {}):
        limit = next((cfg[k] for k in ("max_position_embeddings", "n_positions") if isinstance(cfg.get(k), int)), None)
        if seq_len is not None and limit is not None and seq_len > limit:
            click.echo(
                f"Warning: --seq-len {seq_len} is beyond the model's max_position_embeddings ({limit}); "
                "the figures assume it can run that long",
                err=True,
            )
            return


def _simulations(model: str, source: Any, options: Any, kw: dict[str, Any]) -> Any:
    from x_estimate.model.source import resolve_source
    from x_estimate.report.table import row_precisions
    from x_estimate.simulate.rows import run_simulations

    def build() -> Any:
        from x_estimate.model.skeleton import build_skeleton

        src = source if source is not None else resolve_source(model, kw["library_name"], token=kw["token"])
        return build_skeleton(src, base_model=kw["base_model"], trust_remote_code=kw["trust_remote_code"])

    return run_simulations(
        build,
        row_precisions(options),
        optimizer=options.optimizer,
        batch_size=options.batch_size,
        seq_len=options.seq_len,
        checkpointing=options.activation_checkpointing,
        attn_implementation=options.attn_implementation,
        free_outputs=options.free_outputs,
        device=options.device,
    )


def _cached_simulations(model: str, source: Any, options: Any, kw: dict[str, Any], summary_key: str | None) -> Any:
    from x_estimate.report.table import row_precisions
    from x_estimate.simulate import cache as simulation_cache

    key = (
        None if summary_key is None else simulation_cache.simulation_key(summary_key, options, row_precisions(options))
    )
    if key is not None and (hit := simulation_cache.load_simulations(key)) is not None:
        return hit
    simulations = _simulations(model, source, options, kw)
    if key is not None and not simulations.reason:
        simulation_cache.save_simulations(key, simulations, options)
    return simulations


def _run(model: str, **kw: Any) -> None:
    from x_estimate.model.errors import EstimateError
    from x_estimate.report.table import Options, build_report

    summary, origin, source, summary_key = _summary(model, kw)
    _warn_long_sequence(source, kw["seq_len"])
    simulate = kw["method"] == "simulate" or (kw["method"] == "auto" and kw["seq_len"] is not None)
    options = Options(
        dtypes=tuple(dict.fromkeys(kw["dtypes"])) or DTYPES,
        optimizer=kw["optimizer"],
        precision=kw["precision"],
        int4=kw["int4"],
        num_gpus=kw["num_gpus"],
        shard=kw["shard"],
        seq_len=kw["seq_len"],
        batch_size=kw["batch_size"],
        fits=kw["fits"],
        method="simulate" if simulate else "formula",
        attn_implementation=kw["attn_implementation"],
        activation_checkpointing=kw["activation_checkpointing"],
        free_outputs=kw["free_outputs"],
        # --fits asks whether a GPU holds the model: plan with the GPU's step unless told otherwise.
        device=kw["device"] or ("cuda" if kw["fits"] is not None else "cpu"),
    )
    simulations = _cached_simulations(model, source, options, kw, summary_key) if simulate else None
    if kw["method"] == "simulate" and simulations is not None and simulations.reason:
        raise EstimateError(f"cannot simulate the training step: {simulations.reason}; use --method formula")
    report = build_report(summary, name=model, origin=origin, options=options, simulations=simulations)
    click.echo(json.dumps(report.as_dict(), indent=2) if kw["as_json"] else report.as_text())


def _run_plan(model: str, **kw: Any) -> None:
    from x_estimate.cli.plan import run_plan
    from x_estimate.model.errors import EstimateError

    summary, origin, source, _ = _summary(model, kw)
    _warn_long_sequence(source, kw["seq_len"])
    text, failure = run_plan(model, summary, origin, source, kw)
    click.echo(text)
    if failure is not None:
        raise EstimateError(failure)


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    args = sys.argv[1:] if argv is None else argv
    try:
        known = {o for p in _command.params for o in (*p.opts, *p.secondary_opts)}
        args = spread_multi_value(dashed_options(args, known), "--dtypes")
        code = _command.main(args=args, prog_name="x-estimate", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "Usage: x-estimate [OPTIONS] MODEL", err=True)
        sys.exit(2)
    except click.UsageError as exc:
        # One line, not click's three: what is wrong and where to look.
        click.echo(f"Error: {exc.format_message()} (see x-estimate --help)", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
