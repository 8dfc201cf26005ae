"""``accelerate launch`` flags x-launch refuses, each with its reason, and Accelerate's ``--tee``.

Every other flag of ``accelerate launch --help`` (Accelerate 1.15) is an ``x-launch`` option
with Accelerate's meaning: the settings table's rows (``x_launch.config.launch_config``) and the launch-only
options in ``x_launch.cli.command_line``. The flags below name features x does not offer; each is refused with one
line naming the reason and what to use instead (exit code 2), never silently ignored.
``--use_parallelism_config`` and ``--parallelism_config_*`` are options (tensor, context and sharded
data parallelism on one mesh); their sizes are checked at launch (``x_launch.config.parallelism``).

Examples:
    >>> prepare_launch_args(["--tee", "3", "--log_dir", "logs", "train.py", "--tee"], {"--log_dir"})
    ['--tee=3', '--log_dir', 'logs', 'train.py', '--tee']
    >>> refusal("--megatron-lm-tp-degree").partition(":")[0]
    'x-launch does not run Megatron-LM'
    >>> refusal("--parallelism-config-tp-size") is None  # an option: tensor parallelism on x-runtime's mesh
    True
"""

from __future__ import annotations

import re
from collections.abc import Collection

from x_common.kinds import FALSE_WORDS

__all__ = ["REFUSED", "REFUSED_PREFIXES", "TEE_STREAMS", "answered", "prepare_launch_args", "refusal", "target_index"]

_MEGATRON = (
    "x-launch does not run Megatron-LM: use --parallelism_config_tp_size for tensor parallelism, --use_fsdp or "
    "--use_deepspeed to shard a large model"
)
_FP8 = "x-launch sets no FP8 recipe: pass --mixed_precision fp8 and give the recipe in code (the Accelerator's kwargs)"
_SAGEMAKER = "x-launch does not launch on Amazon SageMaker: run x-launch inside the training job instead"
_TPU_POD = (
    "x-launch does not drive TPU pods over gcloud: run 'x-launch --tpu train.py' on every host "
    "(gcloud compute tpus tpu-vm ssh NAME --worker=all --command '...')"
)
_PDSH = (
    "x-launch starts DeepSpeed through torchrun, not DeepSpeed's pdsh launcher: run x-launch on every "
    "machine with --num_machines and --machine_rank, or inside a SLURM allocation"
)

# flag (underscore spelling) -> reason; a flag given a value here (e.g. "false") is still refused,
# except those in _HARMLESS with the values listed there.
REFUSED: dict[str, str] = {
    "--use_megatron_lm": _MEGATRON,
    "--enable_cpu_affinity": (
        "x-runtime does not pin processes to NUMA cores: start x-launch under numactl or taskset instead"
    ),
    "--mpirun_hostfile": (
        "x-launch does not start CPU jobs through mpirun (no Intel MPI/oneCCL): run x-launch on every machine "
        "with --num_machines and --machine_rank, or inside a SLURM allocation"
    ),
    "--aws_access_key_id": _SAGEMAKER,
    "--aws_secret_access_key": _SAGEMAKER,
    "--tpu_cluster": _TPU_POD,
    "--no_tpu_cluster": _TPU_POD,
    "--tpu_use_sudo": _TPU_POD,
    "--vm": _TPU_POD,
    "--env": _TPU_POD,
    "--deepspeed_hostfile": _PDSH,
    "--deepspeed_inclusion_filter": _PDSH,
    "--deepspeed_exclusion_filter": _PDSH,
    "--deepspeed_multinode_launcher": _PDSH + " (only 'standard', torchrun, is accepted)",
    "--fsdp_activation_checkpointing_offload": (
        "x-runtime's activation checkpointing keeps activations on the device: drop the flag (false is accepted)"
    ),
}
REFUSED_PREFIXES: dict[str, str] = {
    "--megatron_lm_": _MEGATRON,
    "--fp8_": _FP8,
}
# Values that ask for nothing x lacks: what x does anyway.
_HARMLESS = {"--deepspeed_multinode_launcher": ("standard",), "--fsdp_activation_checkpointing_offload": FALSE_WORDS}
_SWITCHES = {"--use_megatron_lm", "--enable_cpu_affinity", "--tpu_cluster"}
_SWITCHES |= {"--no_tpu_cluster", "--tpu_use_sudo"}

# torchrun's --tee: 0 none, 1 stdout, 2 stderr, 3 both, or per rank: "0:1,1:3".
TEE_STREAMS = re.compile(r"[0-3]|\d+:[0-3](,\d+:[0-3])*")
_TEE = ("--tee", "-t")


def _canonical(flag: str) -> str:
    return "--" + flag[2:].replace("-", "_") if flag.startswith("--") else flag


def refusal(flag: str, value: str | None = None) -> str | None:
    """Why x-launch refuses ``flag`` (either spelling), or ``None`` when it does not."""
    name = _canonical(flag)
    if value is not None and value.strip().lower() in _HARMLESS.get(name, ()):
        return None
    if name in REFUSED:
        return REFUSED[name]
    return next((why for prefix, why in REFUSED_PREFIXES.items() if name.startswith(prefix)), None)


def answered(flag: str) -> bool:
    """Whether x-launch answers ``flag`` itself beyond its options: refused with a reason, or accepted and dropped."""
    return refusal(flag) is not None or _canonical(flag.partition("=")[0]) in _HARMLESS


def target_index(args: list[str], value_options: Collection[str]) -> int:
    """Where the target (script or module) starts in ``args``: after the launcher's options and their values.

    A refused flag that takes a value counts with its value, so the split is the one
    ``prepare_launch_args`` makes before it refuses the flag.

    Examples:
        >>> target_index(["--num_processes", "2", "--cpu", "--fp8_backend", "te", "train.py", "-x"], {"--num_processes"})
        5
    """
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--" or not token.startswith("-") or token == "-":
            return i
        name, eq, _ = token.partition("=")
        following = args[i + 1] if i + 1 < len(args) else None
        refused_value = refusal(name) is not None and name not in _SWITCHES
        takes = name in value_options or _canonical(name) in _HARMLESS or refused_value
        if name in _TEE:
            takes = following is not None and TEE_STREAMS.fullmatch(following) is not None
        if takes and not eq and following is not None and not following.startswith("-"):
            i += 1
        i += 1
    return i


def prepare_launch_args(args: list[str], value_options: Collection[str]) -> list[str]:
    """``args`` with the launcher's part checked and ``--tee`` made unambiguous.

    Only the options before the target are read (the script's own arguments are its own).
    ``--tee STREAMS`` (Accelerate's, ``-t`` too) becomes ``--tee=STREAMS``; a bare ``--tee``
    (x-launch's switch) becomes ``--tee=3``, both streams.

    Args:
        value_options: the launcher's options that take a value, so their value is not the target.

    Raises:
        ValueError: a refused flag; the message is ``--flag: reason``.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--" or not token.startswith("-") or token == "-":
            return out + args[i:]
        name, eq, inline = token.partition("=")
        following = args[i + 1] if i + 1 < len(args) else None
        value = inline if eq else None
        takes_value = name not in _SWITCHES and not _canonical(name).startswith("--use_")
        if value is None and takes_value and following is not None and not following.startswith("-"):
            value = following
        why = refusal(name, value)
        if why is not None:
            raise ValueError(f"{name}: {why}")
        if name in _TEE:
            if eq:
                out.append(f"--tee={inline}")
            elif following is not None and TEE_STREAMS.fullmatch(following):
                out.append(f"--tee={following}")
                i += 1
            else:
                out.append("--tee=3")
        elif _canonical(name) in _HARMLESS:
            i += 0 if eq else 1  # accepted and dropped: x does this anyway
        elif name in value_options and not eq and following is not None:
            out += [token, following]
            i += 1
        else:
            out.append(token)
        i += 1
    return out
