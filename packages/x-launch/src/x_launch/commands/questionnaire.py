"""``x-launch config``: the questions, their detected defaults, and re-asking on a bad answer.

Each question is its setting's row in the table (``x_launch.config.launch_config``): the row's
``question`` is asked, its ``describe()`` is the hint, and its kind checks the answer as the
config file is checked. Answers that are valid alone but that the launcher would refuse
together (a rank not below the machine count, port 0 across machines, more processes than
this machine can run) are refused here with the launcher's own reason, and asked again, so
the questionnaire never writes a file that ``x-launch`` then refuses. Which questions come,
and their defaults, depend on the answers so far, as in ``accelerate config``: that flow is
this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from x_launch.config.schema import all_fields, check_value
from x_launch.engines import preflight

__all__ = ["ask_config"]

_ENVIRONMENTS = {"this machine": "this", "several machines": "several", "slurm": "slurm"}
# Several processes that share the work; NO is one process, XLA is torch_xla's own launcher.
_SPREAD = ("MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "FSDP", "DEEPSPEED")
_PORT = 29500  # torchrun's default, Accelerate's usual answer


def _ask(
    key: str,
    default: Any,
    *,
    question: str | None = None,
    hint: str | None = None,
    check: Callable[[Any], None] | None = None,
    optional: bool = False,
) -> Any:
    """The answer to ``key``'s question, checked; Enter gives ``default``.

    Args:
        question: instead of the row's question (the same setting asked another way).
        hint: instead of what the kind expects.
        check: raises ``ValueError`` (a ``ConfigError`` too) with the reason an answer that the
            kind accepts does not fit the answers so far.
        optional: Enter leaves the setting unset (``None``).
    """
    row = all_fields()[key]
    expected = hint or row.describe()

    def convert(text: Any) -> Any:
        if not str(text).strip():
            if optional:
                return None
            if default is None:
                raise click.BadParameter(f"{key}: an answer is needed: {expected}")
        try:
            value = check_value(key, row, text)  # a pasted megabyte is refused with a short preview
            if check is not None:
                check(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        return value

    shown = "" if default is None else ("yes" if default is True else "no" if default is False else default)
    text = f"{question or row.question} ({expected})"
    return click.prompt(text, default=shown, value_proc=convert, show_default=default is not None)


def _fits_where(where: str) -> Callable[[str], None]:
    def check(kind: str) -> None:
        if where == "this" or kind in _SPREAD:
            return
        across = "several machines" if where == "several" else "SLURM nodes"
        why = "runs one process" if kind == "NO" else "runs on one TPU host (x-launch --tpu on each host)"
        raise ValueError(f"distributed_type {kind} {why}; across {across} choose one of {', '.join(_SPREAD)}")

    return check


def _at_least_two(machines: int) -> None:
    if machines < 2:
        raise ValueError(
            "num_machines: several machines means 2 or more; for one, answer 'this machine' to the first question"
        )


def _below(machines: int) -> Callable[[int], None]:
    def check(rank: int) -> None:
        if rank >= machines:
            raise ValueError(f"machine_rank {rank} must be below num_machines {machines} (ranks start at 0)")

    return check


def _resolves(host: str) -> None:
    preflight.resolve_host(host)  # the launcher refuses an address that does not resolve, so ask again now


def _shared_port(port: int) -> None:
    if port == 0:
        raise ValueError(
            f"main_process_port 0 (a free port) works on one machine only; give every machine the same port, "
            f"e.g. {_PORT}"
        )


def _runnable(on_cpu: bool, visible: int) -> Callable[[int], None]:
    """The launcher's limit on processes per machine, for this machine's CPUs or visible GPUs."""

    def check(per_machine: int) -> None:
        if on_cpu:
            preflight.check_cpu_processes(per_machine, None)
        else:
            preflight.check_gpu_processes(per_machine, visible)

    return check


def _gpu_count(gpu_ids: str, gpus: int) -> int:
    return gpus if gpu_ids == "all" else len([g for g in gpu_ids.split(",") if g.strip()])


def _bf16_fits(capabilities: Callable[[], list[tuple[int, int]]]) -> Callable[[str], None]:
    def check(precision: str) -> None:
        if precision == "bf16":
            preflight.check_bf16(capabilities())

    return check


def _nvml() -> list[tuple[int, int]]:
    from x_common.devices import nvml_compute_capabilities

    return nvml_compute_capabilities()


def ask_config(*, gpus: int, capabilities: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """Ask the questions; defaults come from what was detected.

    Args:
        gpus: CUDA devices on this machine.
        capabilities: their compute capabilities (default: asked of NVML when bf16 is answered).
    """
    where = _ENVIRONMENTS[
        click.prompt(
            "Where will the job run?",
            type=click.Choice(list(_ENVIRONMENTS), case_sensitive=False),
            default="this machine",
        ).lower()
    ]
    values: dict[str, Any] = {"compute_environment": "SLURM" if where == "slurm" else "LOCAL_MACHINE"}
    # One machine: several processes only with several GPUs; several machines always spread the work.
    several_gpus = gpus > 1 if where == "this" else gpus > 0
    default_type = "MULTI_GPU" if several_gpus else ("NO" if where == "this" else "MULTI_CPU")
    kind = values["distributed_type"] = _ask("distributed_type", default_type, check=_fits_where(where))
    xla = kind == "XLA"
    use_cpu = not xla and (gpus == 0 or kind == "MULTI_CPU")
    machines = 1
    if where == "several":
        machines = values["num_machines"] = _ask("num_machines", 2, hint="an integer >= 2", check=_at_least_two)
        values["machine_rank"] = _ask("machine_rank", 0, hint=f"0 to {machines - 1}", check=_below(machines))
        values["main_process_ip"] = _ask("main_process_ip", None, hint="an IP address or host name", check=_resolves)
        values["main_process_port"] = _ask(
            "main_process_port", _PORT, question="Port on that machine (the same on every machine)?", check=_shared_port
        )
        values["rdzv_backend"] = _ask("rdzv_backend", "static")
    elif where == "this":
        values["num_machines"], values["machine_rank"] = 1, 0
    else:
        # SLURM decides: nodes, node rank and address from the allocation, one process per GPU it gives.
        click.echo("SLURM decides the machines and the processes per node (one per GPU it gives, else 1).")
    visible = gpus
    if gpus and not use_cpu and not xla and where != "slurm":
        values["gpu_ids"] = _ask("gpu_ids", "all")
        visible = _gpu_count(values["gpu_ids"], gpus)
    on_cpu = use_cpu or gpus == 0
    fits = _runnable(on_cpu, visible)
    if xla:
        click.echo("torch_xla starts one process per TPU device of this host.")
    elif where == "several":
        # Asked per machine: a total that does not split evenly over the machines cannot be written.
        per_machine = _ask(
            "num_processes", 1 if on_cpu else visible, question="How many processes on each machine?", check=fits
        )
        values["num_processes"] = per_machine * machines  # the file holds the whole job's count
    elif where == "this":
        # As Accelerate: no distributed training is one process, not asked.
        default_procs = 2 if on_cpu else visible
        values["num_processes"] = 1 if kind == "NO" else _ask("num_processes", default_procs, check=fits)
    values["use_cpu"] = use_cpu
    if xla:
        values["main_training_function"] = _ask("main_training_function", "main")
    on_gpu = not use_cpu and not xla
    precision = _bf16_fits(lambda: _nvml() if capabilities is None else capabilities)
    values["mixed_precision"] = _ask("mixed_precision", "no", check=precision if on_gpu else None)
    if xla and values["mixed_precision"] == "bf16":
        values["downcast_bf16"] = _ask("downcast_bf16", False)
    _ask_dynamo(values)
    if kind == "FSDP":
        _ask_fsdp(values)
    if kind == "DEEPSPEED":
        _ask_deepspeed(values)
    return values


def _ask_dynamo(values: dict[str, Any]) -> None:
    backend = _ask("dynamo_config.dynamo_backend", "NO")
    if backend != "NO":
        values["dynamo_config.dynamo_backend"] = backend
        values["dynamo_config.dynamo_mode"] = _ask("dynamo_config.dynamo_mode", "default")


def _ask_fsdp(values: dict[str, Any]) -> None:
    values["fsdp_config.fsdp_version"] = _ask("fsdp_config.fsdp_version", 2)
    policy = values["fsdp_config.fsdp_auto_wrap_policy"] = _ask(
        "fsdp_config.fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"
    )
    if policy == "TRANSFORMER_BASED_WRAP":
        # As Accelerate: no answer means the model's own _no_split_modules (transformers declares them).
        names = _ask(
            "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
            None,
            hint="comma-separated names; Enter: the model's _no_split_modules",
            optional=True,
        )
        if names is not None:
            values["fsdp_config.fsdp_transformer_layer_cls_to_wrap"] = names
    elif policy == "SIZE_BASED_WRAP":
        values["fsdp_config.fsdp_min_num_params"] = _ask("fsdp_config.fsdp_min_num_params", 100_000_000)
    values["fsdp_config.fsdp_state_dict_type"] = _ask("fsdp_config.fsdp_state_dict_type", "SHARDED_STATE_DICT")
    values["fsdp_config.fsdp_offload_params"] = _ask("fsdp_config.fsdp_offload_params", False)
    values["fsdp_config.fsdp_activation_checkpointing"] = _ask("fsdp_config.fsdp_activation_checkpointing", False)


def _ask_deepspeed(values: dict[str, Any]) -> None:
    stage = values["deepspeed_config.zero_stage"] = _ask("deepspeed_config.zero_stage", 2)
    if stage >= 2:  # as Accelerate: offloading needs the optimizer state sharded
        device = values["deepspeed_config.offload_optimizer_device"] = _ask(
            "deepspeed_config.offload_optimizer_device", "none"
        )
        if device == "nvme":
            values["deepspeed_config.offload_optimizer_nvme_path"] = _ask(
                "deepspeed_config.offload_optimizer_nvme_path", "/nvme"
            )
    if stage == 3:
        device = values["deepspeed_config.offload_param_device"] = _ask("deepspeed_config.offload_param_device", "none")
        if device == "nvme":
            values["deepspeed_config.offload_param_nvme_path"] = _ask(
                "deepspeed_config.offload_param_nvme_path", "/nvme"
            )
    values["deepspeed_config.gradient_accumulation_steps"] = _ask("deepspeed_config.gradient_accumulation_steps", 1)
    values["deepspeed_config.gradient_clipping"] = _ask("deepspeed_config.gradient_clipping", 1.0)
