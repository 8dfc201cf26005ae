"""The rule that turns a stream of batches into global steps, and how many batches a rank gets.

Every rank of a data-parallel run must walk one global order: a global step is ``num_processes``
consecutive batches (or, with ``split_batches``, one batch cut into that many slices), and the
last step is evened out so that collectives see equal shapes on every rank. The rule works on any
"batch" given the three operations it needs (size, concatenate, slice): the sampler shard applies
it to lists of indices, the prepared loaders to collated batches of iterable datasets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from x_runtime.data.sharding import Sharding

__all__ = ["INDEX_OPS", "BatchOps", "global_steps", "last_step", "rank_batch_count"]


class BatchOps(NamedTuple):
    """How :func:`global_steps` measures, joins and cuts one kind of batch."""

    size: Callable[[Any], int | None]  # samples in a batch; None when it cannot tell
    concat: Callable[[list[Any]], Any]
    slice: Callable[[Any, slice], Any]


def _index_size(batch: Any) -> int | None:
    return len(batch) if isinstance(batch, (list, tuple)) else None


def _index_concat(parts: list[Any]) -> list[Any]:
    return [index for part in parts for index in part]


INDEX_OPS = BatchOps(_index_size, _index_concat, lambda batch, where: batch[where])


def global_steps(
    batches: Iterable[Any],
    sharding: Sharding,
    *,
    batch_size: int | None,
    drop_last: bool = False,
    ops: BatchOps = INDEX_OPS,
) -> Iterator[tuple[list[Any], int]]:
    """Group a stream of batches into global steps: ``(per-rank entries, real samples)`` pairs.

    Without ``sharding.split_batches`` a step is ``num_processes`` consecutive batches and rank ``i``
    gets the ``i``-th; with it, a step is one batch cut into ``num_processes`` contiguous slices.
    Only the last step can be incomplete (too few batches, or a short last batch):

    - ``drop_last``: it is dropped.
    - ``even_batches`` (more than one process): it is filled with samples from the start of the
      stream (cycled if the stream is shorter than a step), so every rank gets a full batch, and
      the real samples are the leading ones in rank order.
    - otherwise: ranks past the data get ``None`` (no batch), one rank may get a short one.

    The real-sample count is the step's full size for complete steps, the count of real samples
    for a padded last step, and ``-1`` for an uneven last step across processes or a batch whose
    size cannot be measured. With one process nothing is padded and the count is the batch size.

    Each step is yielded only once the next batch has arrived, so whether it is the last one is
    known when it is built.
    """
    processes = sharding.num_processes
    split_batches, even_batches = sharding.split_batches, sharding.even_batches
    per_step = sharding.per_step
    full = batch_size if split_batches or batch_size is None else batch_size * processes
    pad = even_batches and not drop_last and processes > 1
    slice_len = batch_size // processes if split_batches and batch_size is not None else None

    def cut(batch: Any) -> list[Any]:
        assert slice_len is not None
        return [ops.slice(batch, slice(i * slice_len, (i + 1) * slice_len)) for i in range(processes)]

    def entries(group: list[Any]) -> list[Any]:
        return cut(group[0]) if split_batches else group

    head: list[Any] = []  # the first batches of the stream, to pad the last step from
    head_samples = 0
    head_batches = 1 if split_batches else processes
    group: list[Any] = []
    pending: list[Any] | None = None
    for batch in batches:
        if pad and (len(head) < head_batches or head_samples < (full or 0)):
            head.append(batch)
            measured = ops.size(batch)
            head_samples += measured if measured is not None else (full or 0)
        if pending is not None:
            yield entries(pending), full if full is not None else -1
            pending = None
        group.append(batch)
        if len(group) == per_step:
            pending, group = group, []
    last_group = pending if pending is not None else group
    if last_group:
        final = last_step(last_group, head, processes, batch_size, split_batches, pad, even_batches, drop_last, ops)
        if final is not None:
            yield final


def _take(head: list[Any], count: int, ops: BatchOps) -> Any:
    source = head[0] if len(head) == 1 else ops.concat(head)
    available = ops.size(source) or 0
    if available < count:
        source = ops.concat([source] * math.ceil(count / max(available, 1)))
    return ops.slice(source, slice(0, count))


def last_step(
    group: list[Any],
    head: list[Any],
    processes: int,
    batch_size: int | None,
    split: bool,
    pad: bool,
    even: bool,
    drop_last: bool,
    ops: BatchOps,
) -> tuple[list[Any], int] | None:
    """The epoch's last global step as the ranks get it (padded, trimmed or dropped), and how many samples are real."""
    sizes = [ops.size(batch) for batch in group]
    last = sizes[-1]
    known = None not in sizes
    real = sum(sizes) if known else -1  # type: ignore[arg-type]
    per_step = 1 if split else processes
    if len(group) == per_step and (batch_size is None or last is None or last >= batch_size):
        if split:
            slice_len = batch_size // processes  # type: ignore[operator]
            return [ops.slice(group[0], slice(i * slice_len, (i + 1) * slice_len)) for i in range(processes)], real
        return group, real
    if drop_last:
        return None
    if processes == 1:
        return group, real
    if split:
        if last is None or batch_size is None:
            raise TypeError("split_batches needs batches whose size can be measured (tensors along dim 0)")
        slice_len = batch_size // processes
        batch = group[0]
        if pad:
            batch = ops.concat([batch, _take(head, batch_size - last, ops)])
            return [ops.slice(batch, slice(i * slice_len, (i + 1) * slice_len)) for i in range(processes)], last
        return [
            ops.slice(batch, slice(i * slice_len, (i + 1) * slice_len)) if i * slice_len < last else None
            for i in range(processes)
        ], -1
    missing = processes - len(group)
    if not even:
        return [*group, *([None] * missing)], -1
    if batch_size is None or not known:
        # Sizes unknown: hand the ranks past the data whole batches from the start instead.
        return [*group, *(head[j % len(head)] for j in range(missing))], real
    tail = ops.concat([group[-1], _take(head, (missing + 1) * batch_size - last, ops)])  # type: ignore[operator]
    filled = [ops.slice(tail, slice(j * batch_size, (j + 1) * batch_size)) for j in range(missing + 1)]
    return [*group[:-1], *filled], real


def rank_batch_count(
    num_batches: int,
    sharding: Sharding,
    *,
    drop_last: bool = False,
    batch_size: int | None = None,
    last_batch_size: int | None = None,
) -> int:
    """How many batches one rank gets out of ``num_batches`` underlying ones (see :func:`global_steps`).

    ``last_batch_size`` is the size of the last underlying batch when it is short (``None`` or 0
    when it is full or unknown).
    """
    num_processes, process_index = sharding.num_processes, sharding.process_index
    split_batches, even_batches = sharding.split_batches, sharding.even_batches
    short = bool(last_batch_size) and batch_size is not None and last_batch_size < batch_size  # type: ignore[operator]
    if num_processes == 1:
        return num_batches - (1 if drop_last and short else 0)
    if split_batches:
        if not short or num_batches == 0:
            return num_batches
        if drop_last:
            return num_batches - 1
        if even_batches:
            return num_batches
        slice_len = batch_size // num_processes  # type: ignore[operator]
        return num_batches - 1 + (1 if process_index * slice_len < last_batch_size else 0)  # type: ignore[operator]
    steps, extra = divmod(num_batches, num_processes)
    if drop_last:
        return steps - (1 if extra == 0 and short and steps else 0)
    if extra == 0:
        return steps
    if even_batches:
        return steps + 1
    return steps + (1 if process_index < extra else 0)
