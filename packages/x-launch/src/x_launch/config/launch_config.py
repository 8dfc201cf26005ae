"""The settings table, and the launch config it types: one field per setting, with its source.

Every launcher setting is one field of ``LaunchConfig``, declared with ``option()``: its kind, default,
meaning, Accelerate's YAML key, its command-line spellings, its question and the contract variable that
carries it to the runtime. ``TABLE`` is those rows; the command-line options (``x_launch.cli.options``), the
config-file keys (``x_launch.config.schema``), the questionnaire, the ``--dry-run`` and ``config show`` display
and the environment the launcher sets (``x_launch.config.contract_env``) are derived from it. Adding a setting is
adding a field here. A resolved ``LaunchConfig`` gives typed values as attributes and, indexed by
config key, each value with its source (``config["num_processes"]`` is ``Setting(4, "--num_processes")``),
which answers "why is it 4 processes?".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from x_common import env
from x_common.fsdp_reshard import reshard_variables
from x_common.kinds import Bool, BoolOrChoice, Choice, Float, GpuIds, Int, Str, StrList
from x_launch.config import stall_settings
from x_launch.config.option import Option, Setting, flag_spellings, option, rows_of

__all__ = ["TABLE", "LaunchConfig", "Setting"]

DEFAULT = "default"  # the source of a value nothing set


_cli = flag_spellings


def _contract(var: env.EnvVar, **row: Any) -> Any:
    """A top-level setting that travels as ``var``, with the variable's kind and default."""
    return option(var.kind, var.default, env=var, **row)


def _carried(var: env.EnvVar, section: str, **row: Any) -> Any:
    """A section key that travels as ``var``: its kind, default and meaning are the variable's.

    Its flag is ``accelerate launch``'s, ``--<key>`` and ``--<key-with-dashes>`` (``cli=True``).
    """
    row.setdefault("cli", True)
    row.setdefault("doc", var.doc)  # a row may say more than the variable's terse doc
    return option(var.kind, var.default, section=section, env=var, **row)


_DYNAMO, _FSDP, _DS = "dynamo_config", "fsdp_config", "deepspeed_config"
_PC = "parallelism_config"  # Accelerate's keys inside it keep their prefix: parallelism_config_tp_size


@dataclass(frozen=True)
class LaunchConfig(Mapping[str, Setting]):
    """Every launcher setting, typed; ``config[key]`` is the value with its source."""

    # --- where and how many -----------------------------------------------------------------
    compute_environment: str = option(Choice(("LOCAL_MACHINE", "SLURM")), "LOCAL_MACHINE", doc="where the job runs")
    distributed_type: str = option(
        env.DISTRIBUTED_TYPE.kind,
        "NO",
        env=env.DISTRIBUTED_TYPE,
        doc="how processes share the work",
        # accelerate launch's switches, first given wins as there (--multi_gpu --use_fsdp is FSDP);
        # --multi_gpu on a machine without GPUs: several CPU processes
        aliases=(("use_deepspeed", "DEEPSPEED"), ("use_fsdp", "FSDP"), ("multi_gpu", "MULTI_GPU")),
        question="How should processes share the work (XLA for TPU)?",
    )
    num_machines: int = option(
        Int(minimum=1),
        1,
        doc="machines (nodes) in the job",
        cli=_cli("num_machines"),
        cli_help="Machines (nodes) in the job: N, or MIN:MAX for an elastic job (starts once MIN joined, goes on "
        "after losing one; c10d, 3 restarts unless --max_restarts). Default 1. Config key: num_machines, min_machines.",
        question="How many machines?",
    )
    min_machines: int | None = option(
        Int(minimum=1), None, doc="fewest machines of an elastic job", cli=_cli("min_machines")
    )
    max_machines: int | None = option(
        Int(minimum=1), None, doc="most machines of an elastic job", cli=_cli("max_machines")
    )
    num_processes: int = option(
        Int(minimum=1),
        1,
        doc="processes in the whole job",
        cli=_cli("num_processes"),
        question="How many processes in total?",
    )
    machine_rank: int = option(
        Int(minimum=0),
        0,
        doc="this machine's index, 0 on the main one",
        cli=_cli("machine_rank"),
        question="Rank of this machine (0 on the main one)?",
    )
    main_process_ip: str | None = option(
        Str(),
        None,
        doc="address of machine 0",
        cli=_cli("main_process_ip"),
        question="Address of the machine with rank 0?",
    )
    main_process_port: int = option(
        Int(minimum=0, maximum=65535),
        29500,
        doc="rendezvous port on machine 0 (0, or unset on one machine: a free one)",
        cli=_cli("main_process_port"),
        question="Port on that machine (0 picks a free one)?",
    )
    rdzv_backend: str = option(
        Choice(("static", "c10d")),
        "static",
        doc="how torchrun's machines meet: static (fixed ranks) or c10d",
        cli=_cli("rdzv_backend"),
        question="Rendezvous backend?",
    )
    max_restarts: int = option(
        Int(minimum=0), 0, doc="restarts of the whole group after a failure", cli=_cli("max_restarts")
    )
    rdzv_conf: str | None = option(
        Str(),
        None,
        doc="extra rendezvous settings passed to torchrun --rdzv-conf (key=value,...)",
        cli=_cli("rdzv_conf"),
    )
    rdzv_timeout: int = option(
        Int(minimum=1),
        600,
        doc="seconds the machines may take to meet before the launch fails (torch's default, 600)",
        cli=_cli("rdzv_timeout"),
    )
    max_cpu_processes: int | None = option(
        Int(minimum=1),
        None,
        doc="CPU processes one machine may start (unset: 8 per logical core)",
        cli=_cli("max_cpu_processes"),
    )
    monitor_interval: float | None = option(
        Float(minimum=0.0), None, doc="seconds between torchrun's checks of its workers", cli=_cli("monitor_interval")
    )
    role: str | None = option(Str(), None, doc="the workers' name in torchrun's logs", cli=("--role",))
    gpu_ids: str = option(
        GpuIds(),
        "all",
        doc="GPUs this machine may use (sets CUDA_VISIBLE_DEVICES)",
        cli=_cli("gpu_ids"),
        question="Which GPUs on this machine?",
    )
    num_cpu_threads_per_process: int | None = option(
        Int(minimum=1),
        None,
        doc="OMP_NUM_THREADS of each process (unset: physical cores / processes on this machine)",
        cli=_cli("num_cpu_threads_per_process"),
    )
    # SLURM's --signal=USR1@N and scancel --signal=USR1 (the runtime's preemption_requested)
    preemption_signals: str | None = option(
        StrList(joined=True),
        None,
        env=env.PREEMPTION_SIGNALS,
        doc="signals that mean 'save and stop' (USR1, USR2, TERM, HUP; unset: USR1): relayed to every rank",
        cli=_cli("preemption_signals"),
    )
    requeue: bool = option(
        Bool(),
        False,
        doc="in a SLURM batch job: after a preemption, once the ranks exit, scontrol requeue the job",
        cli=("--requeue",),
        switch=True,
        cli_help="In a SLURM batch job: after a preemption signal, once the ranks have saved and exited, "
        "requeue the job (scontrol requeue) and exit 0.",
    )
    # the stall watchdog (x_launch.stall.watch, its rows in stall_settings): settings of the launcher, the ranks only get its folder
    stall_timeout: int = option(**stall_settings.TIMEOUT_ROW)
    stall_action: str = option(**stall_settings.ACTION_ROW)
    straggler_report: bool = option(**stall_settings.STRAGGLER_ROW)
    # --- what the training processes get ----------------------------------------------------
    mixed_precision: str = _contract(
        env.MIXED_PRECISION,
        doc="autocast dtype",
        cli=_cli("mixed_precision"),
        question="Mixed precision?",
    )
    use_cpu: bool = _contract(
        env.USE_CPU,
        doc="train on CPU even when GPUs are present",
        cli=("--cpu", "--use_cpu"),
        switch=True,
        cli_help="Run on CPU (gloo) even when GPUs are present.",
    )
    gradient_accumulation_steps: int = _contract(
        env.GRADIENT_ACCUMULATION_STEPS,
        doc="micro-batches per optimizer step",
        cli=_cli("gradient_accumulation_steps"),
    )
    debug: bool = _contract(
        env.DEBUG_MODE,
        doc="check shapes agree across ranks before collectives",
        cli=("--debug",),
        switch=True,
        cli_help="Check that tensors agree in shape across ranks before each collective.",
    )
    provide_accelerate: bool = _contract(
        env.PROVIDE_ACCELERATE,
        doc="serve `import accelerate` from x in every rank (transformers, TRL, PEFT run on x)",
        cli=("--provide-accelerate", "--provide_accelerate"),
        switch=True,
        cli_help="Serve `import accelerate` from x in every rank: transformers' Trainer, TRL and PEFT run on x.",
    )
    tpu: bool = option(
        Bool(),
        False,
        doc="launch through torch_xla",
        cli=("--tpu",),
        switch=True,
        cli_help="Run on this host's TPU devices through torch_xla; each process calls --main_training_function.",
    )
    main_training_function: str = option(
        Str(),
        "main",
        doc="function of the script each TPU process calls",
        cli=_cli("main_training_function"),
        question="Function of the script each TPU process calls?",
    )
    downcast_bf16: bool = option(
        Bool(),
        False,
        doc="on TPU with bf16: float32 tensors too become bfloat16 (XLA_DOWNCAST_BF16)",
        cli=_cli("downcast_bf16"),
        switch=True,
        cli_help="With --tpu and --mixed_precision bf16, also store float32 tensors as bfloat16.",
        question="Store float32 tensors as bfloat16 too (XLA_DOWNCAST_BF16)?",
    )
    # --- dynamo_config ----------------------------------------------------------------------
    dynamo_backend: str = option(
        Choice(tuple(backend.upper() for backend in env.DYNAMO_BACKENDS)),  # Accelerate writes them upper-case
        "NO",
        section=_DYNAMO,
        env=env.DYNAMO_BACKEND,
        doc=env.DYNAMO_BACKEND.doc,
        cli=_cli("dynamo_backend"),
        question="torch.compile backend?",
    )
    dynamo_mode: str = _carried(env.DYNAMO_MODE, _DYNAMO, question="torch.compile mode?")
    dynamo_use_fullgraph: bool = _carried(env.DYNAMO_FULLGRAPH, _DYNAMO, switch=True)
    dynamo_use_dynamic: bool | None = _carried(env.DYNAMO_DYNAMIC, _DYNAMO, switch=True)
    dynamo_use_regional_compilation: bool = _carried(env.DYNAMO_REGIONAL, _DYNAMO, switch=True)
    # --- fsdp_config ------------------------------------------------------------------------
    fsdp_version: int = _carried(env.FSDP_VERSION, _FSDP, question="FSDP version?")
    # FSDP2 takes a bool; Accelerate writes FSDP1's sharding strategy name into the same key.
    fsdp_reshard_after_forward: bool | str = option(
        BoolOrChoice(env.FSDP_SHARDING_STRATEGIES),
        True,
        section=_FSDP,
        env=env.FSDP_RESHARD_AFTER_FORWARD,
        to_env=reshard_variables,
        doc=env.FSDP_RESHARD_AFTER_FORWARD.doc,
        cli=True,
    )
    fsdp_sharding_strategy: str = _carried(env.FSDP_SHARDING_STRATEGY, _FSDP)
    fsdp_auto_wrap_policy: str | None = _carried(env.FSDP_AUTO_WRAP_POLICY, _FSDP, question="What to shard as a unit?")
    # Accelerate's files hold one comma-joined string; the runtime gets the names as a tuple.
    fsdp_transformer_layer_cls_to_wrap: str | None = option(
        StrList(joined=True),
        None,
        section=_FSDP,
        env=env.FSDP_TRANSFORMER_CLS_TO_WRAP,
        doc=env.FSDP_TRANSFORMER_CLS_TO_WRAP.doc,
        cli=True,
        question="Layer classes to wrap (e.g. LlamaDecoderLayer)?",
    )
    fsdp_min_num_params: int = _carried(
        env.FSDP_MIN_NUM_PARAMS, _FSDP, question="Parameters a block needs to be sharded as a unit?"
    )
    fsdp_offload_params: bool = _carried(env.FSDP_OFFLOAD_PARAMS, _FSDP, question="Offload parameters to CPU?")
    fsdp_state_dict_type: str = _carried(env.FSDP_STATE_DICT_TYPE, _FSDP, question="Checkpoint layout?")
    fsdp_activation_checkpointing: bool = _carried(
        env.FSDP_ACTIVATION_CHECKPOINTING, _FSDP, question="Activation checkpointing?"
    )
    fsdp_cpu_ram_efficient_loading: bool = _carried(env.FSDP_CPU_RAM_EFFICIENT_LOADING, _FSDP)
    fsdp_sync_module_states: bool = _carried(env.FSDP_SYNC_MODULE_STATES, _FSDP)
    fsdp_use_orig_params: bool = _carried(
        env.FSDP_USE_ORIG_PARAMS, _FSDP, doc="FSDP1: let the optimizer see the original parameters (use_orig_params)"
    )
    fsdp_forward_prefetch: bool = _carried(env.FSDP_FORWARD_PREFETCH, _FSDP)
    fsdp_backward_prefetch: str = _carried(
        env.FSDP_BACKWARD_PREFETCH, _FSDP, doc="FSDP1: when backward gathers the next block's parameters"
    )
    # --- deepspeed_config -------------------------------------------------------------------
    deepspeed_config_file: str | None = _carried(
        env.DEEPSPEED_CONFIG_FILE, _DS, doc="path of a DeepSpeed JSON config file (as hf_ds_config)"
    )
    zero_stage: int | None = _carried(
        env.DEEPSPEED_ZERO_STAGE,
        _DS,
        doc="DeepSpeed ZeRO stage: 0 none, 1 shards optimizer state, 2 also gradients, 3 also parameters",
        question="ZeRO stage?",
    )
    offload_optimizer_device: str = _carried(
        env.DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE, _DS, question="Optimizer state on?"
    )
    offload_param_device: str = _carried(env.DEEPSPEED_OFFLOAD_PARAM_DEVICE, _DS, question="Parameters on?")
    offload_optimizer_nvme_path: str | None = option(
        Str(),
        None,
        section=_DS,
        doc="folder on an NVMe drive for optimizer state, with offload_optimizer_device nvme",
        cli=True,
        question="Folder on the NVMe drive for optimizer state?",
    )
    offload_param_nvme_path: str | None = option(
        Str(),
        None,
        section=_DS,
        doc="folder on an NVMe drive for parameters, with offload_param_device nvme",
        cli=True,
        question="Folder on the NVMe drive for parameters?",
    )
    # --gradient_accumulation_steps sets this one too (one flag per name, as in Accelerate).
    deepspeed_gradient_accumulation_steps: int | None = option(
        Int(minimum=1),
        None,
        key=f"{_DS}.gradient_accumulation_steps",
        doc="micro-batches per optimizer step under DeepSpeed (--gradient_accumulation_steps sets it too)",
        question="Gradient accumulation steps?",
    )
    gradient_clipping: float | None = _carried(
        env.DEEPSPEED_GRADIENT_CLIPPING, _DS, question="Gradient clipping (max norm)?"
    )
    zero3_init_flag: bool = _carried(env.DEEPSPEED_ZERO3_INIT, _DS)
    zero3_save_16bit_model: bool = _carried(env.DEEPSPEED_ZERO3_SAVE_16BIT_MODEL, _DS)
    # Accelerate's multi-node DeepSpeed launcher keys: accepted, but x starts torchrun on every machine.
    deepspeed_multinode_launcher: str | None = option(Str(), None, section=_DS, doc="accepted; x always uses torchrun")
    deepspeed_hostfile: str | None = option(Str(), None, section=_DS, doc="accepted; x always uses torchrun")
    deepspeed_inclusion_filter: str | None = option(Str(), None, section=_DS, doc="accepted; x always uses torchrun")
    deepspeed_exclusion_filter: str | None = option(Str(), None, section=_DS, doc="accepted; x always uses torchrun")
    deepspeed_moe_layer_cls_names: str | None = option(
        StrList(joined=True),
        None,
        section=_DS,
        doc="mixture-of-experts layer classes DeepSpeed treats as leaves (e.g. MixtralSparseMoeBlock)",
        cli=True,
    )

    # --- parallelism_config: Accelerate's ParallelismConfig, one device mesh ---------------------
    # Travel only when use_parallelism_config is on, as accelerate launch writes them
    # (x_launch.config.parallelism); a non-empty section or any size given turns it on.
    use_parallelism_config: bool = option(
        Bool(),
        False,
        env=env.USE_PARALLELISM_CONFIG,
        doc="give the ranks a ParallelismConfig built from the parallelism_config sizes",
        cli=_cli("use_parallelism_config"),
        switch=True,
        cli_help="Give the ranks a ParallelismConfig built from the --parallelism_config_* sizes; any of "
        "those sizes, or a config file's parallelism_config section, turns it on too.",
    )
    parallelism_config_dp_replicate_size: int = _carried(
        env.PARALLELISM_DP_REPLICATE_SIZE,
        _PC,
        doc="ranks holding whole replicas of the model (DDP; HSDP with dp_shard)",
    )
    parallelism_config_dp_shard_size: int = _carried(
        env.PARALLELISM_DP_SHARD_SIZE, _PC, doc="ranks one replica is sharded over (FSDP2)"
    )
    parallelism_config_tp_size: int = _carried(
        env.PARALLELISM_TP_SIZE, _PC, doc="ranks each layer's weights are split over (tensor parallelism)"
    )
    parallelism_config_cp_size: int = _carried(
        env.PARALLELISM_CP_SIZE, _PC, doc="ranks a sequence is split over (context parallelism, GPUs only)"
    )
    parallelism_config_cp_backend: str = _carried(env.PARALLELISM_CP_BACKEND, _PC)
    # accelerate launch's default; the runtime's handler checks the variable with Accelerate's words.
    parallelism_config_cp_comm_strategy: str = option(
        Choice(("allgather", "alltoall")),
        "allgather",
        section=_PC,
        env=env.PARALLELISM_CP_COMM_STRATEGY,
        doc="how context-parallel ranks exchange keys and values (with cp_size > 1)",
        cli=True,
    )
    parallelism_config_sp_size: int = _carried(
        env.PARALLELISM_SP_SIZE, _PC, doc="sequence-parallel ranks (DeepSpeed Ulysses): only 1, x trains none"
    )
    parallelism_config_sp_backend: str = _carried(env.PARALLELISM_SP_BACKEND, _PC)
    parallelism_config_sp_seq_length: str | None = _carried(env.PARALLELISM_SP_SEQ_LENGTH, _PC)
    parallelism_config_sp_seq_length_is_variable: bool = _carried(env.PARALLELISM_SP_SEQ_LENGTH_IS_VARIABLE, _PC)
    parallelism_config_sp_attn_implementation: str = option(
        Str(),
        "sdpa",  # accelerate launch's default
        section=_PC,
        env=env.PARALLELISM_SP_ATTN_IMPLEMENTATION,
        doc=env.PARALLELISM_SP_ATTN_IMPLEMENTATION.doc,
        cli=True,
    )

    # Where each value came from, by config key; a key missing here has its default.
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Setting]) -> LaunchConfig:
        """The config holding ``settings`` (by config key, already checked); other keys keep defaults."""
        return cls().updated(settings)

    def updated(self, changes: Mapping[str, Setting]) -> LaunchConfig:
        """A copy with ``changes`` (by config key) applied, e.g. what SLURM decides."""
        values = {_BY_KEY[key].name: setting.value for key, setting in changes.items()}
        sources = {**self.sources, **{key: setting.source for key, setting in changes.items()}}
        return dataclasses.replace(self, **values, sources=sources)

    @property
    def elastic(self) -> bool:
        """Whether the job may run on fewer machines than ``num_machines`` (``min_machines`` below it)."""
        return self.min_machines is not None and self.min_machines < self.num_machines

    def source(self, key: str) -> str:
        """Where the value of ``key`` came from (``default`` when nothing set it)."""
        _BY_KEY[key]  # an unknown key is a KeyError, not a silent "default"
        return self.sources.get(key, DEFAULT)

    def is_default(self, key: str) -> bool:
        """Whether nothing set ``key``."""
        return self.source(key) == DEFAULT

    def shown(self) -> list[str]:
        """``  key: value  [source]`` lines for ``config show`` and ``--dry-run``.

        Every top-level key, and the section keys something set: a section's defaults would
        be forty lines about features the job does not use.
        """
        lines = []
        for row in TABLE:
            if row.section is not None and self.is_default(row.key):
                continue
            value = getattr(self, row.name)
            lines.append(f"  {row.key}: {'-' if value is None else value}  [{self.source(row.key)}]")
        return lines

    def __getitem__(self, key: str) -> Setting:
        return Setting(getattr(self, _BY_KEY[key].name), self.source(key))

    def __iter__(self) -> Iterator[str]:
        return iter(_BY_KEY)

    def __len__(self) -> int:
        return len(_BY_KEY)


TABLE: tuple[Option, ...] = rows_of(LaunchConfig)
_BY_KEY: dict[str, Option] = {row.key: row for row in TABLE}
