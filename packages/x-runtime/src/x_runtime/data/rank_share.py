"""One rank's batches cut straight from an epoch's index order, for the common sampler and batch sampler.

:class:`~x_runtime.data.samplers.BatchSamplerShard` deals whole batches: every rank walks the batch
sampler, which pulls every index of every rank's batch through the sampler's generator one by one,
then keeps one batch in ``num_processes``. When the batch sampler is torch's own ``BatchSampler``
over a sampler whose order is known up front (``SequentialSampler``, or a
:class:`~x_runtime.data.samplers.SeedableRandomSampler`, whose order is a function of seed and
epoch), a rank's batch of step ``k`` is the slice ``[(k * W + r) * B, (k * W + r + 1) * B)`` of that
order: one list slice per step, nothing for the other ranks. The last, incomplete step (padding,
uneven ranks, ``drop_last``) is left to the rule every path shares (``steps.last_step``), so the
batches, the real-sample counts and the lengths are the general path's, which the tests compare.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from x_runtime.data.sharding import Sharding
from x_runtime.data.steps import INDEX_OPS, last_step

__all__ = ["rank_share"]


def rank_share(
    order: list[int],
    sharding: Sharding,
    *,
    batch_size: int,
    batch_drop_last: bool,
    drop_last: bool,
    exhausted: Callable[[], None],
) -> Iterator[tuple[list[int] | None, int]] | None:
    """``(this rank's batch or None, real samples of the step)`` per global step, or None when the
    stream is shorter than one step (the general path then pads from what there is).

    ``batch_drop_last`` is the batch sampler's (a short last batch is not made), ``drop_last`` the
    shard's (an incomplete last step is dropped). ``exhausted`` runs where the general path would
    find the sampler at its end: before the last step is handed out.
    """
    processes, rank = sharding.num_processes, sharding.process_index
    samples = len(order)
    full_batches, short = divmod(samples, batch_size)
    complete = full_batches // processes
    if complete == 0:
        return None
    keep_short = bool(short) and not batch_drop_last
    return _deal(order, processes, rank, batch_size, complete, keep_short, sharding, drop_last, exhausted)


def _deal(
    order: list[int],
    processes: int,
    rank: int,
    size: int,
    complete: int,
    short: bool,
    sharding: Sharding,
    drop_last: bool,
    exhausted: Callable[[], None],
) -> Iterator[tuple[list[int] | None, int]]:
    step = processes * size
    real = step
    tail_start = complete * step
    tail_end = len(order) if short else (len(order) // size) * size
    last_complete = complete - 1 if tail_end == tail_start else complete
    for k in range(last_complete):
        start = k * step + rank * size
        yield order[start : start + size], real
    if tail_end == tail_start:  # the stream ends with a complete step
        exhausted()
        start = last_complete * step + rank * size
        yield order[start : start + size], real
        return
    head = [order[j * size : (j + 1) * size] for j in range(processes)]
    group = [order[start : start + size] for start in range(tail_start, tail_end, size)]
    pad = sharding.even_batches and not drop_last and processes > 1
    exhausted()
    final = last_step(group, head, processes, size, False, pad, sharding.even_batches, drop_last, INDEX_OPS)
    if final is not None:
        entries, count = final
        yield entries[rank], count
