"""The two prepared loaders: every process reads its share, or the main process reads and sends.

Both subclass ``torch.utils.data.DataLoader`` through ``_PreparedLoader`` (bookkeeping, epochs,
state, the iteration protocol); :func:`x_runtime.data.data_loader.prepare_data_loader` chooses
and builds one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, cast

import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from x_runtime.core.nested import apply
from x_runtime.data._prepared_loader import _PreparedLoader
from x_runtime.data.samplers import BatchSamplerShard, SkipBatchSampler
from x_runtime.data.sharding import Sharding

__all__ = ["DataLoaderDispatcher", "DataLoaderShard"]


class DataLoaderShard(_PreparedLoader):
    """A ``DataLoader`` yielding one process's share of every global step.

    Built by :func:`prepare_data_loader`. Map-style datasets are sharded by the batch sampler: with
    several processes ``batch_sampler`` is a :class:`~x_runtime.data.samplers.BatchSamplerShard`
    over the user's (as in Accelerate), under a :class:`~x_runtime.data.samplers.SkipBatchSampler`
    only when batches are skipped; with one process a ``SkipBatchSampler`` over the user's. For an
    iterable dataset every process iterates the whole loader and keeps its share of each step.

    Attributes:
        end_of_dataloader: True from just before the last batch is yielded until the next iteration.
        remainder: Real (not padding) samples of the last global step, once it is reached; ``-1``
            when unknown (uneven batches across processes).
        batch_size: Samples per batch on this process; ``total_batch_size``: all processes together.

    Examples:
        >>> from x_runtime.data.data_loader import prepare_data_loader
        >>> loader = prepare_data_loader(DataLoader(list(range(5)), batch_size=2))
        >>> [batch.tolist() for batch in loader], loader.remainder, loader.end_of_dataloader
        ([[0, 1], [2, 3], [4]], 1, True)
    """

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        if not isinstance(dataset, IterableDataset):
            kwargs = self._sharded_sampling(dataset, kwargs)
        super().__init__(dataset, **kwargs)
        self._auto = self.batch_sampler is not None
        self._skipper: SkipBatchSampler | BatchSamplerShard | None = None
        self._shard: BatchSamplerShard | None = None
        if not self._iterable:
            # What skips batches: a SkipBatchSampler, or the shard itself when nothing is skipped.
            source = self.batch_sampler if self._auto else self.__dict__["_raw_sampler"]
            # _sharded_sampling put one of these there (in ``sampler`` when batching is off).
            self._skipper = cast("SkipBatchSampler | BatchSamplerShard", source)
            inner = self._skipper.batch_sampler if isinstance(self._skipper, SkipBatchSampler) else self._skipper
            self._shard = inner if isinstance(inner, BatchSamplerShard) else None
        self._fast = not self._iterable or self.num_processes == 1

    @staticmethod
    def _sharded_sampling(dataset: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Replace the sampling arguments by one skippable, sharded index source."""
        kwargs = dict(kwargs)
        sharding = kwargs.get("sharding") or Sharding()
        source = kwargs.pop("batch_sampler", None)
        auto = True
        if source is None:
            batch_size = kwargs.pop("batch_size", 1)
            shuffle = kwargs.pop("shuffle", None)
            sampler = kwargs.pop("sampler", None)
            drop_last = kwargs.pop("drop_last", False)
            if sampler is None:
                sampler = (
                    RandomSampler(dataset, generator=kwargs.get("generator")) if shuffle else SequentialSampler(dataset)
                )
            if batch_size is None:
                source, auto = sampler, False
            else:
                source = BatchSampler(sampler, batch_size, drop_last)
        if isinstance(source, SkipBatchSampler):
            kwargs["skip_batches"] = kwargs.get("skip_batches", 0) + source.skip_batches
            source = source.batch_sampler
        if sharding.num_processes > 1 and not isinstance(source, BatchSamplerShard):
            source = BatchSamplerShard.for_sharding(source, sharding)
        skip = kwargs.get("skip_batches", 0)
        skipper = source if isinstance(source, BatchSamplerShard) and not skip else SkipBatchSampler(source, skip)
        if auto:
            kwargs["batch_sampler"] = skipper
        else:
            kwargs["sampler"], kwargs["batch_size"] = skipper, None
        return kwargs

    def __len__(self) -> int:
        if self._skipper is None:
            return super().__len__()
        return len(self._skipper)

    def _fast_source(self, skip: int) -> tuple[Iterator[Any], int]:
        if self._skipper is not None:
            self._skipper.skip_once = skip
            return DataLoader.__iter__(self), 0
        return DataLoader.__iter__(self), self.skip_batches + skip

    def _resume_in_world(self, stream: int, saved_world: int) -> tuple[int, int]:
        if self._shard is None or stream % self._stream_per_step(self.num_processes) == 0:
            return super()._resume_in_world(stream, saved_world)
        # The shard drops the used batches from its stream and deals the rest to this world.
        self._shard.stream_skip_once = stream
        return 0, stream

    def _stream_skip(self) -> int:
        return self._shard.stream_skip_once if self._shard is not None else 0

    def _drop_stream_skip(self) -> int:
        if self._shard is not None:
            self._shard.stream_skip_once = 0
        return 0

    def _last_remainder(self, batch: Any) -> int:
        if self._shard is not None:
            return self._shard.remainder
        return super()._last_remainder(batch)

    def _rank_batches(self, skip: int) -> Iterator[tuple[Any, bool, int]]:
        steps = self._steps()
        if skip:
            steps = itertools.islice(steps, skip, None)
        rank = self.process_index
        current = next(steps, None)
        while current is not None:
            upcoming = next(steps, None)
            entry = current[0][rank]
            if entry is not None:
                yield entry, upcoming is None or upcoming[0][rank] is None, current[1]
            current = upcoming

    def _with_skip(self, num_batches: int) -> _PreparedLoader:
        if self._skipper is None:
            return super()._with_skip(num_batches)
        kwargs = self._copy_kwargs(num_batches)
        for name in ("batch_sampler", "sampler", "batch_size"):
            kwargs.pop(name, None)
        skipper = self._skipper
        source = skipper.batch_sampler if isinstance(skipper, SkipBatchSampler) else skipper
        if self._auto:
            kwargs["batch_sampler"] = source
        else:
            kwargs["sampler"], kwargs["batch_size"] = source, None
        return self._share_position(DataLoaderShard(self.dataset, **kwargs))


class _Failure:
    """Sent by rank 0 in place of batches when loading failed, so the other ranks raise too."""

    def __init__(self, text: str) -> None:
        self.text = text


def _compact(batch: Any) -> Any:
    # A pickled view carries its whole storage: a slice of a global batch would ship all of it.
    return apply(lambda t: t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t, batch)


def _scatter(messages: list[Any] | None) -> Any:
    box: list[Any] = [None]
    dist.scatter_object_list(box, messages, src=0)
    return box[0]


class DataLoaderDispatcher(_PreparedLoader):
    """A ``DataLoader`` that only rank 0 iterates; it sends every rank its share of each step.

    For data that cannot be read from every rank (streams, iterable datasets with side effects) or
    should be read once. The exchange is one ``scatter_object_list`` per global step: each rank's
    share is pickled on rank 0 and unpickled where it lands (two collectives, a size exchange then
    the bytes padded to the largest share), and rank 0 loads the whole step while the others wait.
    Correct for any picklable batch, but the cost grows with batch bytes; prefer
    ``dispatch_batches=False`` when every rank can read the data. With one process it is a plain
    loader.

    Needs ``torch.distributed`` initialised when ``num_processes > 1``, with one process per rank
    of the default group (``process_index`` = rank).

    Examples:
        >>> from torch.utils.data import IterableDataset
        >>> from x_runtime.data.data_loader import prepare_data_loader
        >>> class Numbers(IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(5))
        >>> loader = prepare_data_loader(DataLoader(Numbers(), batch_size=2))
        >>> type(loader).__name__, [batch.tolist() for batch in loader]
        ('DataLoaderDispatcher', [[0, 1], [2, 3], [4]])
    """

    _every_rank_iterates = False

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self._fast = self.num_processes == 1

    def _rank_batches(self, skip: int) -> Iterator[tuple[Any, bool, int]]:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("dispatch_batches with more than one process needs torch.distributed initialized")
        if dist.get_world_size() != self.num_processes or dist.get_rank() != self.process_index:
            raise RuntimeError(
                f"dispatch_batches sends over the default process group: rank {dist.get_rank()} of "
                f"{dist.get_world_size()} cannot act as process {self.process_index} of {self.num_processes}"
            )
        if self.process_index == 0:
            return self._send(skip)
        return self._receive()

    def _send(self, skip: int) -> Iterator[tuple[Any, bool, int]]:
        steps = self._steps()
        if skip:
            steps = itertools.islice(steps, skip, None)
        processes = self.num_processes

        def fetch() -> tuple[list[Any], int] | None:
            try:
                return next(steps, None)
            except Exception as error:
                _scatter([_Failure(f"{type(error).__name__}: {error}")] * processes)
                raise

        current = fetch()
        while current is not None:
            upcoming = fetch()
            entries, real = current
            messages: list[Any] = [
                (entry, upcoming is None or upcoming[0][rank] is None, real) for rank, entry in enumerate(entries)
            ]
            own, messages[0] = messages[0], 0  # rank 0 keeps its share rather than pickling it to itself
            messages[1:] = [(_compact(entry), last, real) for entry, last, real in messages[1:]]
            _scatter(messages)
            if own[0] is not None:
                yield own
            current = upcoming
        _scatter([None] * processes)

    def _receive(self) -> Iterator[tuple[Any, bool, int]]:
        while True:
            message = _scatter(None)
            if message is None:
                return
            if isinstance(message, _Failure):
                raise RuntimeError(f"rank 0 failed to load the next batch: {message.text}")
            if message[0] is not None:
                yield message
