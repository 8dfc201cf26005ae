"""Index-level sampling for prepared dataloaders: one shuffle for all ranks, one shard per rank.

Every rank of a data-parallel run iterates its own dataloader, yet together they must walk one
global order: the same permutation on every rank (:class:`SeedableRandomSampler`, seeded by
``(seed, epoch)`` only), dealt out batch by batch (:class:`BatchSamplerShard`), with the last
global step evened out so that collectives see equal shapes on every rank. Sharding indices
rather than loaded samples means a rank never loads or collates another rank's data.

The shard follows the rule of :func:`x_runtime.data.steps.global_steps`, which the
prepared loaders apply to collated batches of iterable datasets as well.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SequentialSampler

from x_runtime.data.rank_share import rank_share
from x_runtime.data.sharding import Sharding
from x_runtime.data.steps import global_steps, rank_batch_count

if TYPE_CHECKING:
    from x_runtime.process.collectives.shared_int import SharedInt

__all__ = [
    "BatchSamplerShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "check_split",
    "mix_seed",
]

_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, epoch: int) -> int:
    """A well-spread seed for ``(seed, epoch)`` (splitmix64): for streams x owns, such as loader workers'."""
    value = (seed * 0x9E3779B97F4A7C15 + epoch + 0x632BE59BD9B4E019) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order is a function of ``(seed, epoch)`` alone.

    Each iteration draws from a ``torch.Generator`` seeded with ``seed + epoch`` (Accelerate's rule,
    so runs match Accelerate's to the index), so every rank holding the same seed produces the
    same permutation whatever its global RNG did, and a one-process run walks the same global
    order as a many-process one. ``epoch`` advances by one
    when an iteration runs to its end (an abandoned iteration leaves it alone); ``set_epoch``
    moves it explicitly, to replay or skip epochs.

    Args:
        data_source: The dataset (only its length is used).
        replacement: Draw with replacement, as ``RandomSampler``.
        num_samples: Samples per epoch; defaults to ``len(data_source)``.
        generator: A generator to draw from: reseeded from ``(seed, epoch)`` at each iteration
            (as Accelerate does), so it stays a function of the pair. ``None``: a fresh one.
        data_seed: The shuffle seed shared by every rank (Accelerate's name); ``seed`` is the same.
            Neither given: ``torch.initial_seed()``, as in Accelerate (``set_seed`` fixes it);
            ``prepare`` takes rank 0's, so ranks that were not seeded alike still agree.
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

    _seed: int | SharedInt  # a SharedInt until its broadcast is first read

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        *,
        data_seed: int | None = None,
        seed: int | SharedInt | None = None,
        epoch: int = 0,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        chosen = data_seed if data_seed is not None else seed
        self.seed = chosen if chosen is not None else torch.initial_seed()
        self.epoch = int(epoch)

    @property
    def seed(self) -> int:
        """The shuffle seed; one still being broadcast from rank 0 (``prepare``'s) is waited for here."""
        if not isinstance(self._seed, int):
            self._seed = self._seed.result() & _MASK64  # an initial seed, unsigned as torch gives it
        return self._seed

    @seed.setter
    def seed(self, value: Any) -> None:
        # ``prepare`` hands over its broadcast still running (anything with ``result()``).
        self._seed = value if hasattr(value, "result") else int(value)

    @property
    def initial_seed(self) -> int:
        """The shuffle seed (Accelerate's attribute name)."""
        return self.seed

    @initial_seed.setter
    def initial_seed(self, value: int) -> None:
        self.seed = int(value)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration shuffle for ``epoch``."""
        self.epoch = int(epoch)

    def order(self) -> list[int]:
        """The indices the next iteration yields, in order, without moving the epoch.

        The generator is seeded with ``seed + epoch`` and torch's ``RandomSampler`` draws from it,
        as in Accelerate, so a run gives Accelerate's order to the index.
        """
        generator = self.generator if self.generator is not None else torch.Generator()
        generator.manual_seed((self.seed + self.epoch) & _MASK64)
        held, self.generator = self.generator, generator
        try:
            return list(RandomSampler.__iter__(self))
        finally:
            self.generator = held

    def __iter__(self) -> Iterator[int]:
        yield from self.order()
        self.epoch += 1


class BatchSamplerShard(Sampler[list[int]]):
    """The batches of ``batch_sampler`` that belong to one rank, by the rule of ``global_steps``.

    Works on indices only, so no rank loads a sample it does not train on. ``remainder`` holds the
    real-sample count of the global step most recently produced; once an iteration is over it is
    the count for the last step (what ``gather_for_metrics`` keeps of the padded last batch).

    Args:
        batch_sampler: Yields lists of indices (any batch sampler; a plain sampler of single
            indices works too, each index then being one "batch").
        num_processes: Ranks sharing the data.
        process_index: This rank.
        split_batches: Cut each batch into ``num_processes`` slices instead of dealing batches.
        even_batches: Pad the last global step from the start of the epoch (see ``global_steps``).
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
        split_batches: bool = False,  # positional too, in Accelerate's order
        even_batches: bool = True,
        *,
        drop_last: bool | None = None,
    ) -> None:
        self._setup(batch_sampler, Sharding(num_processes, process_index, split_batches, even_batches), drop_last)

    @classmethod
    def for_sharding(
        cls, batch_sampler: Iterable[Any], sharding: Sharding, *, drop_last: bool | None = None
    ) -> BatchSamplerShard:
        """The shard of ``batch_sampler`` that ``sharding`` gives this rank."""
        shard = cls.__new__(cls)
        shard._setup(batch_sampler, sharding, drop_last)
        return shard

    def _setup(self, batch_sampler: Iterable[Any], sharding: Sharding, drop_last: bool | None) -> None:
        self.batch_sampler = batch_sampler
        self.sharding = sharding
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False) if drop_last is None else drop_last)
        self.underlying_batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        check_split(self.underlying_batch_size, sharding)
        self.remainder = -1
        self.skip_once = 0  # batches of this rank to skip in the next iteration only (resuming)
        # Batches of the underlying stream to drop before dealing, in the next iteration only: a
        # run resumed at another world size starts where the saved world's steps ended.
        self.stream_skip_once = 0

    @property
    def num_processes(self) -> int:
        return self.sharding.num_processes

    @property
    def process_index(self) -> int:
        return self.sharding.process_index

    @property
    def split_batches(self) -> bool:
        return self.sharding.split_batches

    @property
    def even_batches(self) -> bool:
        return self.sharding.even_batches

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
        return self.sharding.total_batch_size(self.underlying_batch_size)

    def __len__(self) -> int:
        count = max(0, len(self.batch_sampler) - self.stream_skip_once)  # type: ignore[arg-type]
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
            self.sharding,
            drop_last=self.drop_last,
            batch_size=self.underlying_batch_size,
            last_batch_size=last,
        )

    def _rank_share(self, drop: int) -> Iterator[tuple[list[int] | None, int]] | None:
        """This rank's batches cut from the sampler's order (``rank_share``), where that path applies."""
        source = self.batch_sampler
        if self.split_batches or self.num_processes == 1 or type(source) is not BatchSampler:
            return None
        known = _known_order(source.sampler)
        if known is None:
            return None
        order, exhausted = known
        return rank_share(
            order[drop * source.batch_size :],
            self.sharding,
            batch_size=source.batch_size,
            batch_drop_last=source.drop_last,
            drop_last=self.drop_last,
            exhausted=exhausted,
        )

    def __iter__(self) -> Iterator[list[int]]:
        rank = self.process_index
        drop, self.stream_skip_once = self.stream_skip_once, 0
        share = self._rank_share(drop)
        if share is not None:
            skip, self.skip_once = self.skip_once, 0
            for batch, real in share:
                self.remainder = real
                if batch is not None:
                    if skip:
                        skip -= 1
                        continue
                    yield batch
            return
        steps = global_steps(
            itertools.islice(self.batch_sampler, drop, None) if drop else self.batch_sampler,
            self.sharding,
            batch_size=self.underlying_batch_size,
            drop_last=self.drop_last,
        )
        skip, self.skip_once = self.skip_once, 0
        for entries, real in steps:
            self.remainder = real
            batch = entries[rank]
            if batch is not None:
                if skip:
                    skip -= 1
                    continue
                yield batch


def _known_order(sampler: Any) -> tuple[list[int], Callable[[], None]] | None:
    """The sampler's next order and what ends its iteration, when both are known without iterating it."""
    if type(sampler) is SequentialSampler:
        return list(range(len(sampler))), lambda: None
    if isinstance(sampler, SeedableRandomSampler) and type(sampler).__iter__ is SeedableRandomSampler.__iter__:

        def advance() -> None:
            sampler.epoch += 1

        return sampler.order(), advance
    return None


def check_split(batch_size: int | None, sharding: Sharding) -> None:
    """Reject ``split_batches`` for a batch size that cannot be cut evenly between the ranks."""
    num_processes = sharding.num_processes
    if not sharding.split_batches or num_processes == 1:
        return
    if batch_size is None:
        raise ValueError(
            "split_batches=True needs a known batch size (the dataloader's batch_size or its batch sampler's)"
        )
    if batch_size % num_processes != 0:
        raise ValueError(
            f"split_batches=True needs the batch size ({batch_size}) to be a round multiple of the number of "
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
