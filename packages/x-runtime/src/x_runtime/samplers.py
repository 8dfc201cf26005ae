"""Index-level sampling for prepared dataloaders: one shuffle for all ranks, one shard per rank.

Every rank of a data-parallel run iterates its own dataloader, yet together they must walk one
global order: the same permutation on every rank (:class:`SeedableRandomSampler`, seeded by
``(seed, epoch)`` only), dealt out batch by batch (:class:`BatchSamplerShard`), with the last
global step evened out so that collectives see equal shapes on every rank. Sharding indices
rather than loaded samples means a rank never loads or collates another rank's data.

The rule that turns a stream of batches into global steps (:func:`global_steps`) works on any
"batch" given the three operations it needs (size, concatenate, slice), so the data-loader
module applies the very same rule to collated batches of iterable datasets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, NamedTuple

import torch
from torch.utils.data import RandomSampler, Sampler

__all__ = [
    "BatchOps",
    "BatchSamplerShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "check_split",
    "global_steps",
    "rank_batch_count",
]

_MASK64 = (1 << 64) - 1


def _mix_seed(seed: int, epoch: int) -> int:
    # splitmix64 of (seed, epoch): plain ``seed + epoch`` would make (seed=1, epoch=0) replay
    # (seed=0, epoch=1), so consecutive seeds would share permutations shifted by one epoch.
    value = (seed * 0x9E3779B97F4A7C15 + epoch + 0x632BE59BD9B4E019) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order is a function of ``(seed, epoch)`` alone.

    Each iteration draws from a fresh ``torch.Generator`` seeded from the pair, so every rank
    holding the same seed produces the same permutation whatever its global RNG did, and a
    one-process run walks the same global order as a many-process one. ``epoch`` advances by one
    when an iteration runs to its end (an abandoned iteration leaves it alone); ``set_epoch``
    moves it explicitly, to replay or skip epochs.

    Args:
        data_source: The dataset (only its length is used).
        replacement: Draw with replacement, as ``RandomSampler``.
        num_samples: Samples per epoch; defaults to ``len(data_source)``.
        seed: The shuffle seed shared by every rank.
        epoch: The epoch the next iteration shuffles for.

    Examples:
        >>> sampler = SeedableRandomSampler(range(5), seed=3)
        >>> first = list(sampler)
        >>> sampler.epoch, sorted(first)
        (1, [0, 1, 2, 3, 4])
        >>> sampler.set_epoch(0)
        >>> list(sampler) == first
        True
    """

    def __init__(
        self,
        data_source: Sized,
        *,
        replacement: bool = False,
        num_samples: int | None = None,
        seed: int = 0,
        epoch: int = 0,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples)  # type: ignore[arg-type]
        self.seed = int(seed)
        self.epoch = int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration shuffle for ``epoch``."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        size = len(self.data_source)
        count = self.num_samples
        generator = torch.Generator()
        generator.manual_seed(_mix_seed(self.seed, self.epoch))
        if self.replacement:
            yield from torch.randint(size, (count,), dtype=torch.int64, generator=generator).tolist()
        else:
            whole, rest = divmod(count, size)
            for _ in range(whole):
                yield from torch.randperm(size, generator=generator).tolist()
            if rest:
                yield from torch.randperm(size, generator=generator)[:rest].tolist()
        self.epoch += 1


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
    *,
    num_processes: int,
    batch_size: int | None,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
    ops: BatchOps = INDEX_OPS,
) -> Iterator[tuple[list[Any], int]]:
    """Group a stream of batches into global steps: ``(per-rank entries, real samples)`` pairs.

    Without ``split_batches`` a step is ``num_processes`` consecutive batches and rank ``i``
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
    processes = num_processes
    per_step = 1 if split_batches else processes
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
        final = _last_step(last_group, head, processes, batch_size, split_batches, pad, even_batches, drop_last, ops)
        if final is not None:
            yield final


def _take(head: list[Any], count: int, ops: BatchOps) -> Any:
    source = head[0] if len(head) == 1 else ops.concat(head)
    available = ops.size(source) or 0
    if available < count:
        source = ops.concat([source] * math.ceil(count / max(available, 1)))
    return ops.slice(source, slice(0, count))


def _last_step(
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
    *,
    num_processes: int,
    process_index: int,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
    batch_size: int | None = None,
    last_batch_size: int | None = None,
) -> int:
    """How many batches one rank gets out of ``num_batches`` underlying ones (see :func:`global_steps`).

    ``last_batch_size`` is the size of the last underlying batch when it is short (``None`` or 0
    when it is full or unknown).
    """
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


class BatchSamplerShard(Sampler[list[int]]):
    """The batches of ``batch_sampler`` that belong to one rank, as the rule of :func:`global_steps`.

    Works on indices only, so no rank loads a sample it does not train on. ``remainder`` holds the
    real-sample count of the global step most recently produced; once an iteration is over it is
    the count for the last step (what ``gather_for_metrics`` keeps of the padded last batch).

    Args:
        batch_sampler: Yields lists of indices (any batch sampler; a plain sampler of single
            indices works too, each index then being one "batch").
        num_processes: Ranks sharing the data.
        process_index: This rank.
        split_batches: Cut each batch into ``num_processes`` slices instead of dealing batches.
        even_batches: Pad the last global step from the start of the epoch (see :func:`global_steps`).
        drop_last: Drop an incomplete last step; defaults to ``batch_sampler.drop_last``.

    Raises:
        ValueError: ``split_batches`` with a batch size that is unknown or not a multiple of
            ``num_processes``.

    Examples:
        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> batches = BatchSampler(SequentialSampler(range(10)), batch_size=2, drop_last=False)
        >>> list(BatchSamplerShard(batches, num_processes=2, process_index=1))
        [[2, 3], [6, 7], [0, 1]]
    """

    def __init__(
        self,
        batch_sampler: Iterable[Any],
        num_processes: int = 1,
        process_index: int = 0,
        *,
        split_batches: bool = False,
        even_batches: bool = True,
        drop_last: bool | None = None,
    ) -> None:
        if num_processes < 1 or not 0 <= process_index < num_processes:
            raise ValueError(f"process_index {process_index} is not in range for {num_processes} processes")
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False) if drop_last is None else drop_last)
        self.underlying_batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        check_split(self.underlying_batch_size, num_processes, split_batches)
        self.remainder = -1

    @property
    def sampler(self) -> Any:
        """The index sampler under the batch sampler (where shuffling and ``set_epoch`` live)."""
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this rank."""
        size = self.underlying_batch_size
        return size // self.num_processes if size is not None and self.split_batches else size

    @property
    def total_batch_size(self) -> int | None:
        """Samples per global step, all ranks together."""
        size = self.underlying_batch_size
        return size if size is None or self.split_batches else size * self.num_processes

    def __len__(self) -> int:
        count = len(self.batch_sampler)  # type: ignore[arg-type]
        last = None
        sampler = self.sampler
        if (
            self.underlying_batch_size
            and not getattr(self.batch_sampler, "drop_last", False)
            and isinstance(sampler, Sized)
        ):
            last = len(sampler) % self.underlying_batch_size
        return rank_batch_count(
            count,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
            batch_size=self.underlying_batch_size,
            last_batch_size=last,
        )

    def __iter__(self) -> Iterator[list[int]]:
        rank = self.process_index
        steps = global_steps(
            self.batch_sampler,
            num_processes=self.num_processes,
            batch_size=self.underlying_batch_size,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
        )
        for entries, real in steps:
            self.remainder = real
            batch = entries[rank]
            if batch is not None:
                yield batch


def check_split(batch_size: int | None, num_processes: int, split_batches: bool) -> None:
    """Reject ``split_batches`` for a batch size that cannot be cut evenly between the ranks."""
    if not split_batches or num_processes == 1:
        return
    if batch_size is None:
        raise ValueError(
            "split_batches=True needs a known batch size (the dataloader's batch_size or its batch sampler's)"
        )
    if batch_size % num_processes != 0:
        raise ValueError(
            f"split_batches=True needs the batch size ({batch_size}) to be a multiple of the number of "
            f"processes ({num_processes})"
        )


class SkipBatchSampler(Sampler[Any]):
    """The batches of ``batch_sampler`` after the first ``skip_batches`` ones.

    ``skip_batches`` applies to every iteration; ``skip_once`` adds batches to skip in the next
    iteration only (resuming mid-epoch). Skipped batches are index lists, never loaded.

    Examples:
        >>> skipper = SkipBatchSampler([[0, 1], [2, 3], [4, 5]], skip_batches=1)
        >>> list(skipper), len(skipper)
        ([[2, 3], [4, 5]], 2)
    """

    def __init__(self, batch_sampler: Iterable[Any], skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = int(skip_batches)
        self.skip_once = 0

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def batch_size(self) -> int | None:
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self) -> bool:
        return bool(getattr(self.batch_sampler, "drop_last", False))

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches - self.skip_once)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        skip = self.skip_batches + self.skip_once
        self.skip_once = 0
        if not skip:
            yield from self.batch_sampler
            return
        iterator = iter(self.batch_sampler)
        for _ in range(skip):
            if next(iterator, _DONE) is _DONE:
                return
        yield from iterator


_DONE = object()
