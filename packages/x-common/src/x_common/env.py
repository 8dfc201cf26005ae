"""The launcher -> runtime contract: every environment variable name x reads or writes.

``x-launch`` resolves a launch configuration and passes what the training process needs
through the variables below; ``x_runtime`` reads them back with the same objects. Variables
that torch's elastic agent and SLURM set are named here too, so no other module spells a
variable name.

Examples:
    >>> env = {}
    >>> MIXED_PRECISION.write("bf16", env)
    'bf16'
    >>> env
    {'X_MIXED_PRECISION': 'bf16'}
    >>> MIXED_PRECISION.read(env), GRADIENT_ACCUMULATION_STEPS.read(env)
    ('bf16', 1)

A script started by ``accelerate launch`` gets Accelerate's variables instead; each contract
variable names Accelerate's as its fallbacks (``Fallback``), read with Accelerate's spellings
when no ``X_*`` variable is set (``X_*`` wins):

    >>> MIXED_PRECISION.read({"ACCELERATE_MIXED_PRECISION": "bf16"})
    'bf16'
    >>> DISTRIBUTED_TYPE.read({"ACCELERATE_USE_FSDP": "true"})
    'FSDP'
    >>> FSDP_SHARDING_STRATEGY.read({"FSDP_SHARDING_STRATEGY": "2"})
    'SHARD_GRAD_OP'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from x_common.env_var import EnvVar, Fallback
from x_common.kinds import TRUE_WORDS, Bool, Choice, Float, Int, Kind, Numbered, Str, StrList

PREFIX = "X_"
LAUNCH_FLAG_PREFIX = "X_LAUNCH_"

DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "FSDP", "DEEPSPEED", "XLA")
MIXED_PRECISIONS = ("no", "fp16", "bf16", "fp8")
DYNAMO_BACKENDS = ("no", "eager", "aot_eager", "inductor", "cudagraphs", "onnxrt", "openxla", "tensorrt", "tvm", "ipex")
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
FSDP_SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP_AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
FSDP_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT")
FSDP_BACKWARD_PREFETCHES = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
DEEPSPEED_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _var(name: str, kind: Kind, default: Any, doc: str) -> EnvVar:
    """The contract variable ``X_<name>``, with Accelerate's variables (``_ACCELERATE``) as fallbacks."""
    return EnvVar(PREFIX + name, kind, default, doc, _ACCELERATE.get(name, ()))


# Accelerate's spellings: FSDP enums by name or torch's number, in Accelerate's order.
_ACC_STATE_DICT_ORDER = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
_ACC_FSDP2 = "FSDP_VERSION"
_ACC_RESHARD = "FSDP_RESHARD_AFTER_FORWARD"


def _not_fsdp2(environ: Mapping[str, str]) -> bool:
    """Accelerate reads FSDP1's sharding strategy only when FSDP_VERSION is not 2."""
    return environ.get(_ACC_FSDP2, "1").strip() != "2"


def _reshard_is_bool(environ: Mapping[str, str]) -> bool:
    """FSDP_RESHARD_AFTER_FORWARD holds a boolean (FSDP2), not an FSDP1 strategy name."""
    return environ.get(_ACC_RESHARD, "").strip().lower() in (*TRUE_WORDS, "0", "false", "no", "off")


def _reshard_is_strategy(environ: Mapping[str, str]) -> bool:
    return not _reshard_is_bool(environ)


# Accelerate's variables for each contract variable (by name without the prefix), tried in
# order when the X_* one is unset: what `accelerate launch` writes (utils/launch.py) and its
# runtime reads, with its spellings ("True", "2" for SHARD_GRAD_OP, "none" for unset).
_SHARDING = Numbered(FSDP_SHARDING_STRATEGIES)
_ACCELERATE: dict[str, tuple[Fallback, ...]] = {
    # Accelerate's state.py tries DeepSpeed first
    "DISTRIBUTED_TYPE": (
        Fallback("ACCELERATE_USE_DEEPSPEED", means="DEEPSPEED"),
        Fallback("ACCELERATE_USE_FSDP", means="FSDP"),
    ),
    "MIXED_PRECISION": (Fallback("ACCELERATE_MIXED_PRECISION"),),
    "USE_CPU": (Fallback("ACCELERATE_USE_CPU"),),
    "TORCH_DEVICE": (Fallback("ACCELERATE_TORCH_DEVICE"),),
    "GRADIENT_ACCUMULATION_STEPS": (Fallback("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"),),
    "DEBUG_MODE": (Fallback("ACCELERATE_DEBUG_MODE"),),
    "DYNAMO_BACKEND": (Fallback("ACCELERATE_DYNAMO_BACKEND"),),
    "DYNAMO_MODE": (Fallback("ACCELERATE_DYNAMO_MODE"),),
    "DYNAMO_FULLGRAPH": (Fallback("ACCELERATE_DYNAMO_USE_FULLGRAPH"),),
    "DYNAMO_DYNAMIC": (Fallback("ACCELERATE_DYNAMO_USE_DYNAMIC"),),
    "DYNAMO_REGIONAL": (Fallback("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"),),
    "FSDP_VERSION": (Fallback(_ACC_FSDP2),),
    # a boolean under FSDP2; FSDP1 strategy names in it go to the sharding strategy, as the config's key
    "FSDP_RESHARD_AFTER_FORWARD": (Fallback(_ACC_RESHARD, when=_reshard_is_bool),),
    "FSDP_SHARDING_STRATEGY": (
        Fallback(_ACC_RESHARD, _SHARDING, when=_reshard_is_strategy),
        Fallback("FSDP_SHARDING_STRATEGY", _SHARDING, when=_not_fsdp2),  # always written; FSDP2 ignores it
    ),
    "FSDP_AUTO_WRAP_POLICY": (Fallback("FSDP_AUTO_WRAP_POLICY", Numbered(FSDP_AUTO_WRAP_POLICIES)),),
    "FSDP_TRANSFORMER_CLS_TO_WRAP": (Fallback("FSDP_TRANSFORMER_CLS_TO_WRAP"),),
    "FSDP_MIN_NUM_PARAMS": (Fallback("FSDP_MIN_NUM_PARAMS"),),
    "FSDP_OFFLOAD_PARAMS": (Fallback("FSDP_OFFLOAD_PARAMS"),),
    "FSDP_STATE_DICT_TYPE": (Fallback("FSDP_STATE_DICT_TYPE", Numbered(FSDP_STATE_DICT_TYPES, _ACC_STATE_DICT_ORDER)),),
    "FSDP_ACTIVATION_CHECKPOINTING": (Fallback("FSDP_ACTIVATION_CHECKPOINTING"),),
    "FSDP_CPU_RAM_EFFICIENT_LOADING": (Fallback("FSDP_CPU_RAM_EFFICIENT_LOADING"),),
    "FSDP_SYNC_MODULE_STATES": (Fallback("FSDP_SYNC_MODULE_STATES"),),
    "FSDP_USE_ORIG_PARAMS": (Fallback("FSDP_USE_ORIG_PARAMS"),),
    "FSDP_FORWARD_PREFETCH": (Fallback("FSDP_FORWARD_PREFETCH"),),
    "FSDP_BACKWARD_PREFETCH": (Fallback("FSDP_BACKWARD_PREFETCH", Numbered(FSDP_BACKWARD_PREFETCHES)),),
    "DEEPSPEED_CONFIG_FILE": (Fallback("ACCELERATE_DEEPSPEED_CONFIG_FILE"),),
    "DEEPSPEED_ZERO_STAGE": (Fallback("ACCELERATE_DEEPSPEED_ZERO_STAGE"),),
    "DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": (Fallback("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"),),
    "DEEPSPEED_OFFLOAD_PARAM_DEVICE": (Fallback("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"),),
    "DEEPSPEED_GRADIENT_CLIPPING": (Fallback("ACCELERATE_GRADIENT_CLIPPING"),),
    "DEEPSPEED_ZERO3_INIT": (Fallback("ACCELERATE_DEEPSPEED_ZERO3_INIT"),),
    "DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": (Fallback("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"),),
}

# --- set by x-launch, read by x_runtime ---------------------------------------------------
LAUNCHED_BY_X = _var("LAUNCHED", Bool(), False, "set by x-launch in every process it starts")
NOTEBOOK_WORKER = _var(
    "NOTEBOOK_WORKER", Bool(), False, "set by notebook_launcher in each worker: joining fails fast if a peer returned"
)
PREEMPTION_SIGNALS = _var("PREEMPTION_SIGNALS", Str(), None, "signals a worker takes as a preemption (unset: USR1)")
PREEMPTION_FILE = _var("PREEMPTION_FILE", Str(), None, "marker x-launch creates when the job is asked to stop")
FAILURE_REPORT = _var(
    "FAILURE_REPORT", Str(), None, "file x-launch's torchrun agent writes the failing rank to (JSON), for its summary"
)
PROGRESS_DIR = _var(
    "PROGRESS_DIR", Str(), None, "folder where each rank keeps its progress record and stack dumps (--stall-timeout)"
)
PREEMPTION_SEEN = ".seen"  # <PREEMPTION_FILE>.seen: created by the ranks that stopped for the request
CONFIG_FILE = _var("CONFIG_FILE", Str(), None, "launch config file to use instead of the default location")
DISTRIBUTED_TYPE = _var("DISTRIBUTED_TYPE", Choice(DISTRIBUTED_TYPES), None, "strategy chosen by the launcher")
MIXED_PRECISION = _var("MIXED_PRECISION", Choice(MIXED_PRECISIONS), "no", "autocast dtype for the prepared model")
USE_CPU = _var("USE_CPU", Bool(), False, "train on CPU even when an accelerator is present")
TORCH_DEVICE = _var("TORCH_DEVICE", Str(), None, "the torch device each process computes on, as written (cuda:1, cpu)")
GRADIENT_ACCUMULATION_STEPS = _var("GRADIENT_ACCUMULATION_STEPS", Int(minimum=1), 1, "micro-batches per optimizer step")
PROCESS_GROUP_TIMEOUT = _var("PROCESS_GROUP_TIMEOUT", Int(minimum=1), 1800, "seconds a collective may wait")
DEBUG_MODE = _var("DEBUG_MODE", Bool(), False, "check shapes agree across ranks before each collective")
MEMORY_GUARD = _var(
    "MEMORY_GUARD",
    Bool(),
    True,
    "compare step 2's memory peak with x-estimate's plan and warn before a batch too large",
)
MEMORY_BUDGET = _var(
    "MEMORY_BUDGET", Str(), None, "memory per device the guard plans against (20GiB); unset: the device's"
)
DYNAMO_BACKEND = _var("DYNAMO_BACKEND", Choice(DYNAMO_BACKENDS), "no", "torch.compile backend")
DYNAMO_MODE = _var("DYNAMO_MODE", Choice(DYNAMO_MODES), "default", "torch.compile mode")
DYNAMO_FULLGRAPH = _var("DYNAMO_FULLGRAPH", Bool(), False, "torch.compile(fullgraph=True)")
DYNAMO_DYNAMIC = _var("DYNAMO_DYNAMIC", Bool(), None, "torch.compile(dynamic=...); unset lets torch decide")
DYNAMO_REGIONAL = _var("DYNAMO_REGIONAL", Bool(), False, "compile repeated blocks once instead of the whole model")
# Read at interpreter start by x-common's .pth line (x_common.accelerate_import), before any x code runs.
PROVIDE_ACCELERATE = _var(
    "PROVIDE_ACCELERATE", Bool(), False, "serve `import accelerate` from x (transformers, TRL, PEFT run on x)"
)

FSDP_VERSION = _var("FSDP_VERSION", Int(minimum=1, maximum=2), 2, "1: FullyShardedDataParallel, 2: fully_shard")
FSDP_RESHARD_AFTER_FORWARD = _var("FSDP_RESHARD_AFTER_FORWARD", Bool(), True, "free gathered parameters after forward")
FSDP_SHARDING_STRATEGY = _var(
    "FSDP_SHARDING_STRATEGY", Choice(FSDP_SHARDING_STRATEGIES), "FULL_SHARD", "FSDP1 sharding strategy"
)
FSDP_AUTO_WRAP_POLICY = _var("FSDP_AUTO_WRAP_POLICY", Choice(FSDP_AUTO_WRAP_POLICIES), None, "what to shard separately")
FSDP_TRANSFORMER_CLS_TO_WRAP = _var(
    "FSDP_TRANSFORMER_CLS_TO_WRAP", StrList(), None, "layer classes for TRANSFORMER_BASED_WRAP"
)
FSDP_MIN_NUM_PARAMS = _var("FSDP_MIN_NUM_PARAMS", Int(minimum=0), 100_000_000, "parameter count for SIZE_BASED_WRAP")
FSDP_OFFLOAD_PARAMS = _var("FSDP_OFFLOAD_PARAMS", Bool(), False, "keep sharded parameters on CPU")
FSDP_STATE_DICT_TYPE = _var(
    "FSDP_STATE_DICT_TYPE", Choice(FSDP_STATE_DICT_TYPES), "FULL_STATE_DICT", "checkpoint layout"
)
FSDP_ACTIVATION_CHECKPOINTING = _var(
    "FSDP_ACTIVATION_CHECKPOINTING", Bool(), False, "recompute wrapped blocks in backward"
)
FSDP_CPU_RAM_EFFICIENT_LOADING = _var("FSDP_CPU_RAM_EFFICIENT_LOADING", Bool(), False, "load weights on rank 0 only")
FSDP_SYNC_MODULE_STATES = _var("FSDP_SYNC_MODULE_STATES", Bool(), True, "broadcast rank 0's weights at wrap time")
FSDP_USE_ORIG_PARAMS = _var("FSDP_USE_ORIG_PARAMS", Bool(), True, "FSDP1 use_orig_params")
FSDP_FORWARD_PREFETCH = _var("FSDP_FORWARD_PREFETCH", Bool(), False, "gather the next block during forward")
FSDP_BACKWARD_PREFETCH = _var(
    "FSDP_BACKWARD_PREFETCH", Choice(FSDP_BACKWARD_PREFETCHES), "BACKWARD_PRE", "FSDP1 prefetch"
)

DEEPSPEED_CONFIG_FILE = _var("DEEPSPEED_CONFIG_FILE", Str(), None, "DeepSpeed JSON config")
DEEPSPEED_ZERO_STAGE = _var("DEEPSPEED_ZERO_STAGE", Int(minimum=0, maximum=3), None, "ZeRO stage")
DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE = _var(
    "DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", Choice(DEEPSPEED_OFFLOAD_DEVICES), "none", "where optimizer state lives"
)
DEEPSPEED_OFFLOAD_PARAM_DEVICE = _var(
    "DEEPSPEED_OFFLOAD_PARAM_DEVICE", Choice(DEEPSPEED_OFFLOAD_DEVICES), "none", "where ZeRO-3 parameters live"
)
DEEPSPEED_GRADIENT_CLIPPING = _var("DEEPSPEED_GRADIENT_CLIPPING", Float(minimum=0.0), None, "max gradient norm")
DEEPSPEED_ZERO3_INIT = _var("DEEPSPEED_ZERO3_INIT", Bool(), False, "build the model already partitioned")
DEEPSPEED_ZERO3_SAVE_16BIT_MODEL = _var(
    "DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", Bool(), False, "gather 16-bit weights on save"
)

CONTRACT: tuple[EnvVar, ...] = tuple(value for value in list(globals().values()) if isinstance(value, EnvVar))

# --- set by others: torch's elastic agent, SLURM, XLA, CUDA -------------------------------
RANK = EnvVar("RANK", Int(minimum=0), None, "global rank (torchrun)")
LOCAL_RANK = EnvVar("LOCAL_RANK", Int(minimum=0), None, "rank on this machine (torchrun)")
WORLD_SIZE = EnvVar("WORLD_SIZE", Int(minimum=1), None, "number of processes (torchrun)")
LOCAL_WORLD_SIZE = EnvVar("LOCAL_WORLD_SIZE", Int(minimum=1), None, "processes on this machine (torchrun)")
GROUP_RANK = EnvVar("GROUP_RANK", Int(minimum=0), None, "machine rank (torchrun)")
MASTER_ADDR = EnvVar("MASTER_ADDR", Str(), None, "rendezvous host")
MASTER_PORT = EnvVar("MASTER_PORT", Int(minimum=0, maximum=65535), None, "rendezvous port")
TORCHRUN_LOCAL_ADDR = EnvVar("PET_LOCAL_ADDR", Str(), None, "torchrun --local-addr: the address others reach it by")
TORCHRUN_SIGNALS = EnvVar("PET_SIGNALS_TO_HANDLE", Str(), None, "torchrun --signals-to-handle: what its agent stops on")
TORCHELASTIC_RUN_ID = EnvVar("TORCHELASTIC_RUN_ID", Str(), None, "set in every worker torchrun starts")
# An elastic (MIN:MAX) launch sets it to 1 for torchrun: each rendezvous round then gives its workers a
# fresh store, since the agent store shared across rounds keeps the dead round's keys.
TORCH_NO_SHARED_RDZV_STORE = EnvVar(
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", Bool(), False, "torchrun c10d: a new worker store each rendezvous round"
)
SLURM_JOB_ID = EnvVar("SLURM_JOB_ID", Int(minimum=0), None, "allocation id")
SLURM_JOB_NODELIST = EnvVar("SLURM_JOB_NODELIST", Str(), None, "hosts of the allocation, compressed")
SLURM_NNODES = EnvVar("SLURM_NNODES", Int(minimum=1), None, "hosts in the allocation")
SLURM_NODEID = EnvVar("SLURM_NODEID", Int(minimum=0), None, "this host's index in the allocation")
SLURM_PROCID = EnvVar("SLURM_PROCID", Int(minimum=0), None, "global task rank (srun)")
SLURM_LOCALID = EnvVar("SLURM_LOCALID", Int(minimum=0), None, "task rank on this host (srun)")
SLURM_NTASKS = EnvVar("SLURM_NTASKS", Int(minimum=1), None, "tasks in the step")
SLURM_NTASKS_PER_NODE = EnvVar("SLURM_NTASKS_PER_NODE", Int(minimum=1), None, "only with --ntasks-per-node")
SLURM_TASKS_PER_NODE = EnvVar("SLURM_TASKS_PER_NODE", Str(), None, "tasks per host, compressed, e.g. '2(x3),1'")
SLURM_CPUS_PER_TASK = EnvVar("SLURM_CPUS_PER_TASK", Int(minimum=1), None, "only with --cpus-per-task")
SLURM_GPUS_ON_NODE = EnvVar("SLURM_GPUS_ON_NODE", Int(minimum=0), None, "GPUs allocated on this host")
SLURM_STEP_ID = EnvVar("SLURM_STEP_ID", Str(), None, "set inside a job step (srun), not in the batch script")
SLURM_STEP_NODELIST = EnvVar("SLURM_STEP_NODELIST", Str(), None, "hosts of the step, compressed (srun)")
CUDA_VISIBLE_DEVICES = EnvVar("CUDA_VISIBLE_DEVICES", Str(), None, "CUDA devices this process sees")
OMP_NUM_THREADS = EnvVar("OMP_NUM_THREADS", Int(minimum=1), None, "CPU threads per process (OpenMP, torch)")
PJRT_DEVICE = EnvVar("PJRT_DEVICE", Choice(("TPU", "CPU", "CUDA", "NEURON")), None, "torch_xla runtime device")
XLA_DOWNCAST_BF16 = EnvVar("XLA_DOWNCAST_BF16", Bool(), None, "torch_xla: store float32 tensors as bfloat16")
CPU_NUM_DEVICES = EnvVar("CPU_NUM_DEVICES", Int(minimum=1), None, "torch_xla virtual CPU devices")
DS_ACCELERATOR = EnvVar(
    "DS_ACCELERATOR", Str(), None, "DeepSpeed's accelerator (cpu, cuda, ...), read when it is imported"
)
HF_TOKEN = EnvVar("HF_TOKEN", Str(), None, "Hugging Face token for gated and private repos")
XDG_CACHE_HOME = EnvVar("XDG_CACHE_HOME", Str(), None, "where per-user caches live (default ~/.cache)")
XDG_CONFIG_HOME = EnvVar("XDG_CONFIG_HOME", Str(), None, "where per-user config files live (default ~/.config)")
HF_HOME = EnvVar("HF_HOME", Str(), None, "Hugging Face's home; Accelerate keeps its config below it")
# Accelerate's deprecated FP8RecipeKwargs reads its backend here when not given; no launcher writes it.
ACCELERATE_ENABLE_RICH = EnvVar("ACCELERATE_ENABLE_RICH", Bool(), False, "rich tracebacks and bars (is_rich_available)")
ACCELERATE_FP8_BACKEND = EnvVar("ACCELERATE_FP8_BACKEND", Str(), None, "FP8RecipeKwargs' backend: te or msamp")

# Accelerate's ParallelismConfig reads its sizes and handlers from these when a field is not given
# (``accelerate launch --parallelism_config_*`` writes them); x's ParallelismConfig reads the same.
_PC = "PARALLELISM_CONFIG_"
# Written by ``--use_parallelism_config`` (or a config file's ``parallelism_config`` keys): the
# Accelerator builds a ParallelismConfig from the variables below when the code passes none.
USE_PARALLELISM_CONFIG = EnvVar(
    "ACCELERATE_USE_PARALLELISM_CONFIG", Bool(words=True), False, "build a ParallelismConfig from PARALLELISM_CONFIG_*"
)
PARALLELISM_DP_REPLICATE_SIZE = EnvVar(_PC + "DP_REPLICATE_SIZE", Int(minimum=1), 1, "replicated data-parallel ranks")
PARALLELISM_DP_SHARD_SIZE = EnvVar(_PC + "DP_SHARD_SIZE", Int(minimum=1), 1, "ranks a model is sharded over (FSDP)")
PARALLELISM_TP_SIZE = EnvVar(_PC + "TP_SIZE", Int(minimum=1), 1, "tensor-parallel ranks")
PARALLELISM_CP_SIZE = EnvVar(_PC + "CP_SIZE", Int(minimum=1), 1, "context-parallel ranks")
PARALLELISM_CP_BACKEND = EnvVar(_PC + "CP_BACKEND", Choice(("torch",)), "torch", "context-parallel implementation")
PARALLELISM_SP_SIZE = EnvVar(_PC + "SP_SIZE", Int(minimum=1), 1, "sequence-parallel ranks")
PARALLELISM_SP_BACKEND = EnvVar(
    _PC + "SP_BACKEND", Choice(("deepspeed",)), "deepspeed", "sequence-parallel implementation"
)
# Read as text: the handlers check them with Accelerate's messages ("Invalid cp_comm_strategy: ...").
PARALLELISM_CP_COMM_STRATEGY = EnvVar(_PC + "CP_COMM_STRATEGY", Str(), None, "allgather or alltoall")
PARALLELISM_SP_SEQ_LENGTH = EnvVar(_PC + "SP_SEQ_LENGTH", Str(), None, "fixed sequence length, or None")
PARALLELISM_SP_SEQ_LENGTH_IS_VARIABLE = EnvVar(
    _PC + "SP_SEQ_LENGTH_IS_VARIABLE", Bool(words=True), True, "sequence length may change between batches"
)
PARALLELISM_SP_ATTN_IMPLEMENTATION = EnvVar(
    _PC + "SP_ATTN_IMPLEMENTATION", Str(), None, "attention kernel under sequence parallelism"
)

FOREIGN: tuple[EnvVar, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, EnvVar) and value not in CONTRACT
)


def launch_flag_var(flag: str) -> str:
    """Environment variable that supplies an ``x-launch`` flag when the flag is not given.

    Examples:
        >>> launch_flag_var("--num_processes")
        'X_LAUNCH_NUM_PROCESSES'
    """
    name = flag.lstrip("-").replace("-", "_").upper()
    if not re.fullmatch(r"[A-Z0-9_]+", name):
        raise ValueError(f"invalid flag {flag!r}: expected a long option such as '--num_processes'")
    return LAUNCH_FLAG_PREFIX + name


def to_environ(values: Mapping[EnvVar, Any]) -> dict[str, str]:
    """Strings for the given variables, validated; ``None`` values are left out.

    Examples:
        >>> to_environ({USE_CPU: True, GRADIENT_ACCUMULATION_STEPS: 4, DYNAMO_DYNAMIC: None})
        {'X_USE_CPU': '1', 'X_GRADIENT_ACCUMULATION_STEPS': '4'}
    """
    return {var.name: var.format(value) for var, value in values.items() if value is not None}


def read_contract(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every contract variable's typed value (defaults for the unset ones), keyed by name.

    Raises:
        ValueError: one or more values are malformed; all problems are listed, one per line.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    for var in CONTRACT:
        try:
            values[var.name] = var.read(environ)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("\n".join(problems))
    return values


__all__ = [
    "CONTRACT",
    "DEEPSPEED_OFFLOAD_DEVICES",
    "DISTRIBUTED_TYPES",
    "DYNAMO_BACKENDS",
    "DYNAMO_MODES",
    "FOREIGN",
    "FSDP_AUTO_WRAP_POLICIES",
    "FSDP_BACKWARD_PREFETCHES",
    "FSDP_SHARDING_STRATEGIES",
    "FSDP_STATE_DICT_TYPES",
    "MIXED_PRECISIONS",
    "PREEMPTION_SEEN",
    "EnvVar",
    "Fallback",
    "launch_flag_var",
    "read_contract",
    "to_environ",
    *(name for name, value in list(globals().items()) if isinstance(value, EnvVar)),
]
