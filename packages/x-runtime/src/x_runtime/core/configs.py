"""Configuration objects an ``Accelerator`` takes, with Accelerate's names and defaults.

``DataLoaderConfiguration`` and ``ProjectConfiguration`` group options; the ``*Kwargs`` handlers
carry keyword arguments through to the torch object they configure (DDP, the grad scaler,
``init_process_group``, autocast), so code written for Accelerate passes them unchanged.
"""

from __future__ import annotations

import enum
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from x_common import env
from x_runtime.core.settings import current_settings

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "ProfileKwargs",
    "ProjectConfiguration",
    "TERecipeKwargs",
]


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards and places dataloaders.

    Args:
        split_batches: the loader's batch size is the global one, split across processes
            (otherwise each process draws its own batch of that size).
        dispatch_batches: the main process reads the data and sends each process its share;
            ``None`` means yes for iterable datasets, no for map-style ones.
        even_batches: pad the last global batch with samples from the start so every process
            gets the same number of full batches (``gather_for_metrics`` drops the padding).
        use_seedable_sampler: shuffle with a permutation that depends only on seed and epoch.
            Off by default (as Accelerate): loaders draw from torch's global RNG as Accelerate's do.
        data_seed: that seed; ``None`` draws one from torch's RNG on the main process.
        non_blocking: asynchronous host-to-device copies (with ``pin_memory=True``).
        use_stateful_dataloader: ``load_state`` also resumes iteration at the next batch.

    Examples:
        >>> DataLoaderConfiguration(even_batches=False).split_batches
        False
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class ProjectConfiguration:
    """Where checkpoints and logs go, and how checkpoints are named and pruned.

    Args:
        project_dir: root folder for checkpoints (``<project_dir>/checkpoints``) and logs.
        logging_dir: tracker output; defaults to ``project_dir``.
        automatic_checkpoint_naming: ``save_state()`` writes ``checkpoints/checkpoint_<iteration>``.
        total_limit: keep at most this many automatic checkpoints (oldest removed after a
            new one is complete).
        iteration: number of the next automatic checkpoint.

    Examples:
        >>> ProjectConfiguration(project_dir="runs/a").logging_dir
        'runs/a'
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0

    def __post_init__(self) -> None:
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        elif self.logging_dir is not None:
            self.logging_dir = os.fspath(self.logging_dir)
        if self.total_limit is not None and self.total_limit < 1:
            raise ValueError(f"total_limit must be >= 1 or None, got {self.total_limit}")

    def set_directories(self, project_dir: str | os.PathLike | None) -> None:
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclass
class KwargsHandler:
    """Base of the keyword-argument handlers: ``to_kwargs`` returns only non-default values."""

    def to_kwargs(self) -> dict[str, Any]:
        default = type(self)()
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)
        }


class DDPCommunicationHookType(str, enum.Enum):
    """DDP communication hooks: compress gradients to fp16/bf16, or PowerSGD (batched or not)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Passed to ``torch.nn.parallel.DistributedDataParallel``.

    ``comm_hook`` (a ``DDPCommunicationHookType`` or its value) is registered on the DDP model;
    ``comm_wrapper`` (FP16 or BF16) compresses what a PowerSGD hook sends; ``comm_state_option``
    holds ``PowerSGDState`` arguments (e.g. ``{"matrix_approximation_rank": 2}``).
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.comm_hook = DDPCommunicationHookType(self.comm_hook)
        self.comm_wrapper = DDPCommunicationHookType(self.comm_wrapper)
        if self.comm_wrapper not in (
            DDPCommunicationHookType.NO,
            DDPCommunicationHookType.FP16,
            DDPCommunicationHookType.BF16,
        ):
            raise ValueError(f"comm_wrapper must be no, fp16 or bf16, not {self.comm_wrapper.value}")

    def to_kwargs(self) -> dict[str, Any]:
        """DDP's own arguments (the hook is registered after wrapping, see ``comm_hook_spec``)."""
        hook_fields = ("comm_hook", "comm_wrapper", "comm_state_option")
        return {k: v for k, v in super().to_kwargs().items() if k not in hook_fields}

    def comm_hook_spec(self) -> tuple[str, str, dict] | None:
        """``(hook, wrapper, state options)`` as plain values, or None without a hook."""
        if self.comm_hook == DDPCommunicationHookType.NO:
            return None
        return self.comm_hook.value, self.comm_wrapper.value, dict(self.comm_state_option)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Passed to ``torch.amp.GradScaler`` under fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Passed to ``torch.distributed.init_process_group``; ``timeout`` bounds every collective."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclass
class AutocastKwargs(KwargsHandler):
    """Options of the autocast context used for mixed precision."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 through torchao: ``config`` is a ``torchao.float8.Float8LinearConfig`` (default: its default).

    ``module_filter_func(module, name) -> bool`` chooses the ``Linear`` layers to convert; by
    default every one whose dimensions are multiples of 16 except the first and the last
    (embedding-side and output layers lose most accuracy in fp8).
    """

    config: Any = None
    module_filter_func: Callable[[Any, str], bool] | None = None


@dataclass
class TERecipeKwargs(KwargsHandler):
    """Transformer Engine's recipe fields, accepted so configs load; this version runs torchao."""

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None


@dataclass
class FP8RecipeKwargs(TERecipeKwargs):
    """Deprecated, as in Accelerate: an fp8 recipe whose ``backend`` picks Transformer Engine or MS-AMP.

    Building one warns (``FutureWarning``). ``backend="te"`` (the default) is a ``TERecipeKwargs``
    with the same fields, accepted and refused under fp8 as that one is; ``backend="msamp"`` is
    refused here, since x has no MS-AMP. Without ``backend``, ``$ACCELERATE_FP8_BACKEND`` names it, as in
    Accelerate. ``opt_level`` is MS-AMP's field, kept so configs load.
    Use ``AORecipeKwargs`` (x's fp8 runs through torchao).

    Raises:
        ValueError: ``backend`` is "msamp", or neither "te" nor "msamp".

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", FutureWarning)
        ...     FP8RecipeKwargs(backend="te").backend
        'TE'
    """

    opt_level: str | None = None
    backend: str | None = None

    def __post_init__(self) -> None:
        warnings.warn(
            "FP8RecipeKwargs is deprecated (Accelerate removes it in v2.0.0): use AORecipeKwargs "
            "(x runs fp8 through torchao) or TERecipeKwargs",
            FutureWarning,
            stacklevel=3,
        )
        given = self.backend if self.backend is not None else current_settings().get(env.ACCELERATE_FP8_BACKEND)
        backend = "TE" if given is None else str(given).upper()
        if backend == "MSAMP":
            raise ValueError("FP8RecipeKwargs(backend='msamp'): x has no MS-AMP; use AORecipeKwargs() (torchao fp8)")
        if backend != "TE":
            raise ValueError(f"FP8RecipeKwargs: `backend` must be 'TE' or 'MSAMP', got {self.backend!r}")
        self.backend = backend


@dataclass
class ProfileKwargs(KwargsHandler):
    """``torch.profiler.profile`` options for ``Accelerator.profile()``.

    Args:
        activities: "cpu", "cuda", "xpu", "mtia", "hpu" (default: CPU, and the GPU if any).
        schedule_option: ``torch.profiler.schedule`` arguments (wait, warmup, active, repeat,
            skip_first).
        on_trace_ready: called with the profiler when a scheduled trace is ready.
        record_shapes: record the shapes of operator inputs.
        profile_memory: track tensor memory allocation and release.
        with_stack: record the source location of each operator.
        with_flops: estimate the FLOPs of matrix multiplications and convolutions.
        with_modules: record the module hierarchy of each operator.
        output_trace_dir: each rank writes ``profile_<rank>.json`` (a Chrome trace) there.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> Any:
        """The ``torch.profiler.profile`` these options describe."""
        import torch

        names = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}
        activities = self.activities
        if activities is None:
            activities = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        unknown = [a for a in activities if a not in names]
        if unknown:
            raise ValueError(f"unknown profiler activities {unknown}: choose from {sorted(names)}")
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option else None
        return torch.profiler.profile(
            activities=[getattr(torch.profiler.ProfilerActivity, names[a]) for a in activities],
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@dataclass
class Handlers:
    """The handlers an Accelerator was given, one per kind."""

    ddp: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)
    scaler: GradScalerKwargs = field(default_factory=GradScalerKwargs)
    init: InitProcessGroupKwargs = field(default_factory=InitProcessGroupKwargs)
    autocast: AutocastKwargs = field(default_factory=AutocastKwargs)
    fp8: KwargsHandler | None = None
    profile: ProfileKwargs | None = None

    @classmethod
    def from_list(cls, handlers: list[KwargsHandler] | None) -> Handlers:
        result = cls()
        seen: set[type] = set()
        slots = {
            DistributedDataParallelKwargs: "ddp",
            GradScalerKwargs: "scaler",
            InitProcessGroupKwargs: "init",
            AutocastKwargs: "autocast",
            AORecipeKwargs: "fp8",
            TERecipeKwargs: "fp8",
            FP8RecipeKwargs: "fp8",
            ProfileKwargs: "profile",
        }
        for handler in handlers or []:
            kind = type(handler)
            if kind not in slots:
                raise TypeError(
                    f"unsupported kwargs handler {kind.__name__}; expected one of {sorted(k.__name__ for k in slots)}"
                )
            if kind in seen:
                raise ValueError(f"kwargs_handlers holds two {kind.__name__} objects; pass one")
            seen.add(kind)
            setattr(result, slots[kind], handler)
        return result


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Accumulation options: steps, whether the scheduler follows them, and the last batch.

    Args:
        num_steps: micro-batches per optimizer step (None: 1).
        adjust_scheduler: the scheduler counts micro-batches the way the optimizer counts steps.
        sync_with_dataloader: synchronise gradients on a loader's last batch even off a boundary.
        sync_each_batch: synchronise on every micro-batch (less memory, more communication).
    """

    num_steps: int | None = None  # None: 1 step (Accelerate's default, which to_kwargs leaves out)
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
