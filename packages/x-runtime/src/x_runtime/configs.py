"""Configuration objects an ``Accelerator`` takes, with Accelerate's names and defaults.

``DataLoaderConfiguration`` and ``ProjectConfiguration`` group options; the ``*Kwargs`` handlers
carry keyword arguments through to the torch object they configure (DDP, the grad scaler,
``init_process_group``, autocast), so code written for Accelerate passes them unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
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
    use_seedable_sampler: bool = True
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


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Passed to ``torch.nn.parallel.DistributedDataParallel``."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False


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
class _Handlers:
    """The handlers an Accelerator was given, one per kind."""

    ddp: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)
    scaler: GradScalerKwargs = field(default_factory=GradScalerKwargs)
    init: InitProcessGroupKwargs = field(default_factory=InitProcessGroupKwargs)
    autocast: AutocastKwargs = field(default_factory=AutocastKwargs)
    fp8: KwargsHandler | None = None

    @classmethod
    def from_list(cls, handlers: list[KwargsHandler] | None) -> _Handlers:
        result = cls()
        seen: set[type] = set()
        slots = {
            DistributedDataParallelKwargs: "ddp",
            GradScalerKwargs: "scaler",
            InitProcessGroupKwargs: "init",
            AutocastKwargs: "autocast",
            AORecipeKwargs: "fp8",
            TERecipeKwargs: "fp8",
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
        num_steps: micro-batches per optimizer step.
        adjust_scheduler: the scheduler counts micro-batches the way the optimizer counts steps.
        sync_with_dataloader: synchronise gradients on a loader's last batch even off a boundary.
        sync_each_batch: synchronise on every micro-batch (less memory, more communication).
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
