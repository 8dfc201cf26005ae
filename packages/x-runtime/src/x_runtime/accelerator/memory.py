"""The accelerator's memory guard (``x_runtime.memory``): its options read once, attached once.

The guard watches the first prepared model and optimizer: the training loop's step. It is built
when the accelerator is (from the settings: ``X_MEMORY_GUARD``, ``X_MEMORY_BUDGET``) and attached
when both are prepared; it stays off where x-estimate is not installed, where DeepSpeed's engine
steps the optimizer, and under torch.compile (a Python hook in the compiled forward would break
its graph).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from x_common import env
from x_common.sizes import parse_size
from x_runtime.core.one_line_errors import OneLineError
from x_runtime.core.settings import Settings
from x_runtime.core.unwrap import unwrap_model
from x_runtime.memory.guard import GuardOptions, MemoryGuard
from x_runtime.memory.simulation import x_estimate_installed
from x_runtime.process.topology.distributed_type import DistributedType

__all__ = ["BadMemoryBudgetError", "attach_memory_guard", "memory_guard_options"]


class BadMemoryBudgetError(OneLineError, ValueError):
    """``X_MEMORY_BUDGET`` is not a size."""

    job_wide = True


def memory_guard_options(
    settings: Settings,
    *,
    process: Any,
    precision: str,
    kind: str | None,
    accumulation: int,
    compiled: bool,
    split: bool = False,
) -> GuardOptions | None:
    """The guard's options for this run, or None where it stays off (``kind``: the strategy's, if it chose one;
    ``split``: the layout splits layers over tensor parallel ranks, which the guard's plan does not)."""
    kind = kind or process.distributed_type
    if not settings.get(env.MEMORY_GUARD) or compiled or kind == DistributedType.DEEPSPEED:
        return None
    raw = settings.get(env.MEMORY_BUDGET)
    budget = None
    if raw is not None:
        try:
            budget = parse_size(raw)
        except ValueError:
            raise BadMemoryBudgetError(
                f"{env.MEMORY_BUDGET.name}={raw!r} is not a size: write it as 20GiB, 500MB or a number of bytes"
            ) from None
    if not x_estimate_installed():
        return None
    return GuardOptions(
        device=process.device,
        precision=precision,
        is_main=process.is_main_process,
        compare=kind not in (DistributedType.FSDP, DistributedType.XLA) and not split,
        budget=budget,
        accumulation=accumulation,
    )


def attach_memory_guard(options: GuardOptions | None, models: list[Any], optimizers: list[Any]) -> MemoryGuard | None:
    """Watch the model the first optimizer trains, once both are prepared; None until then (or when off).

    A teacher or reference model prepared beside it (no optimizer steps its weights) is not the
    step planned. A fault here leaves the guard off: it never fails ``prepare``.
    """
    if options is None or not models or not optimizers:
        return None
    inner = getattr(optimizers[0], "optimizer", optimizers[0])
    if not hasattr(inner, "register_step_post_hook"):
        return None
    trained = {id(p) for group in getattr(inner, "param_groups", []) for p in group["params"]}
    for wrapped in models:
        if hasattr(wrapped, "_orig_mod") or hasattr(getattr(wrapped, "module", None), "_orig_mod"):
            continue  # compiled before prepare: the guard's hook would run inside its graph
        model = unwrap_model(wrapped)
        if not any(id(p) in trained for p in model.parameters()):
            continue
        buckets = not getattr(wrapped, "gradient_as_bucket_view", True)  # a DistributedDataParallel wrapper's
        try:
            guard = MemoryGuard(dataclasses.replace(options, ddp_buckets=buckets))
            guard.watch(model, inner)
        except Exception:  # the guard watches the run; a fault of its own never stops it
            return None
        return guard
    return None
