"""The prepared loaders: one base that keeps the loop's bookkeeping, and its two kinds.

``PreparedLoader`` is what both share: epoch and position bookkeeping, checkpoint state, the
iteration protocol that knows the last batch ahead, and registration with the gradient state.
``DataLoaderShard`` has every process read its share; ``DataLoaderDispatcher`` has the main process
read and send each rank its share. :func:`~x_runtime.data.loader.prepare.prepare_data_loader`
chooses and builds one.

How the last batch is known before it is handed out, without loading the next one:
``end_of_dataloader`` must be set while the last batch is in the user's hands. Accelerate's loaders
fetch one batch ahead to know it, which runs the next batch's dataset reads and ``collate_fn``
before the user's step: whatever they draw from the global RNG (a masking collator, a random
augmentation) is then in the state a ``save_state`` between the two batches captures, and a
resumed run draws it a second time for the same batch. Resume is no longer exact.

For a map-style dataset the look-ahead is on the index lists instead (:class:`IndexPeek`): the
batch sampler is read one list ahead, so the loader knows which batch is the last while the next
batch is neither loaded nor collated until it is asked for. Iterable datasets have no index lists:
the look-ahead there is on batches, as Accelerate's.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from x_runtime.core.nested import apply, concat_batches, find_batch_size, send_to_device, slice_batch
from x_runtime.core.out_of_memory import note_batch
from x_runtime.data.epoch_rng import EpochRandomness
from x_runtime.data.gradient_state import GradientState
from x_runtime.data.loader_state import DataLoaderStateMixin, StatefulLook
from x_runtime.data.samplers import BatchSamplerShard, SeedableRandomSampler, SkipBatchSampler, check_split
from x_runtime.data.sharding import Sharding
from x_runtime.data.steps import BatchOps, global_steps, rank_batch_count

__all__ = ["DataLoaderDispatcher", "DataLoaderShard", "IndexPeek", "PreparedLoader", "batches_with_last"]


_END = object()


class IndexPeek:
    """An index source read one item ahead; ``exhausted`` once no item follows the last one handed out.

    Examples:
        >>> peek = IndexPeek([[0, 1], [2]])
        >>> items = iter(peek)
        >>> next(items), peek.exhausted, next(items), peek.exhausted
        ([0, 1], False, [2], True)
    """

    def __init__(self, source: Iterable[Any]) -> None:
        self.source = source
        self.handed = 0
        self.exhausted = False

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        # Re-iterable: a persistent-workers DataLoader iterator keeps this object across epochs.
        self.handed, self.exhausted = 0, False
        items = iter(self.source)
        current = next(items, _END)
        self.exhausted = current is _END
        while current is not _END:
            upcoming = next(items, _END)
            self.exhausted = upcoming is _END
            self.handed += 1
            yield current
            current = upcoming


def batches_with_last(iterator: Iterator[Any], drop: int, peek: IndexPeek | None) -> Iterator[tuple[Any, bool]]:
    """``(batch, is it the last)`` for the batches of ``iterator`` after the first ``drop``.

    With ``peek`` (the index source ``iterator`` reads), a batch is the last when the source has
    run out and every list it handed out has come back as a batch (workers read lists ahead);
    without, the next batch is fetched ahead.
    """
    received = 0
    for _ in range(drop):
        if next(iterator, _END) is _END:
            return
        received += 1
    if peek is not None:
        for batch in iterator:
            received += 1
            yield batch, peek.exhausted and received == peek.handed
        return
    current = next(iterator, _END)
    if current is _END:
        return
    for upcoming in iterator:
        yield current, False
        current = upcoming
    yield current, True


class _EpochCounter:
    """Where the epoch lives when no seedable sampler holds it (sequential or iterable data)."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)


class _Cursor:
    # Per-batch bookkeeping lives here rather than on the loader: DataLoader.__setattr__ is Python
    # code, a slots store is not.
    __slots__ = ("done", "epoch", "offset", "position")

    def __init__(self) -> None:
        self.position = 0
        self.offset = 0  # stream batches dropped before this epoch's iteration (resumed at another world size)
        self.epoch: int | None = None
        self.done = False  # the running epoch's last batch has been handed out


_TENSOR_OPS = BatchOps(find_batch_size, concat_batches, slice_batch)


def _unwrap(source: Any) -> Any:
    while isinstance(source, (SkipBatchSampler, BatchSamplerShard)):
        source = source.batch_sampler
    return source


class PreparedLoader(StatefulLook, DataLoaderStateMixin, DataLoader):
    """What both prepared loaders share: bookkeeping, epochs, state and the iteration protocol."""

    _fast = True  # iterate the DataLoader directly (else ``_rank_batches`` produces the batches)
    _every_rank_iterates = True  # each rank draws its own order (the dispatcher: rank 0 alone)

    def __init__(
        self,
        dataset: Any,
        *,
        sharding: Sharding | None = None,
        device: torch.device | str | None = None,
        non_blocking: bool = False,
        gradient_state: GradientState | None = None,
        epoch_source: Any = None,
        seed: int | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        use_seedable_sampler: bool = True,
        **dataloader_kwargs: Any,
    ) -> None:
        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        self.__dict__["_exposed_sampler"] = None
        super().__init__(dataset, **dataloader_kwargs)
        self._iterable = isinstance(dataset, IterableDataset)
        inner = source = None
        sharding = sharding if sharding is not None else Sharding()
        self.sharding = sharding
        self.num_processes = sharding.num_processes
        self.process_index = sharding.process_index
        self.split_batches = sharding.split_batches
        self.even_batches = sharding.even_batches
        if self._iterable:
            self._underlying_batch_size = self.__dict__["_raw_batch_size"]
            self._underlying_drop_last = bool(self.drop_last)
        else:
            source = _unwrap(self.batch_sampler if self.batch_sampler is not None else self.__dict__["_raw_sampler"])
            self._underlying_batch_size = getattr(source, "batch_size", None)
            self._underlying_drop_last = bool(getattr(source, "drop_last", False))
            if self.batch_sampler is not None:
                self.__dict__["_exposed_sampler"] = getattr(source, "sampler", source)
            inner = getattr(source, "sampler", source)
            if epoch_source is None and isinstance(inner, SeedableRandomSampler):
                epoch_source = inner
        check_split(self._underlying_batch_size, sharding)
        self.device = torch.device(device) if device is not None else None
        # Batches come out of a DataLoader on the CPU: a CPU target needs no walk over the batch.
        self._move = self.device is not None and self.device.type != "cpu"
        self.non_blocking = non_blocking
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self._epochs = epoch_source if epoch_source is not None else _EpochCounter()
        self._seed = seed
        self._rng = EpochRandomness(
            inner,
            dataloader_kwargs.get("generator"),
            sharding,
            every_rank_iterates=self._every_rank_iterates,
            global_draws=True,
        )
        self.skip_batches = int(skip_batches)
        self.use_stateful_dataloader = use_stateful_dataloader
        self.end_of_dataloader = False
        self.remainder = -1
        self._resume = 0
        self._cursor = _Cursor()
        # The epoch also reaches the user's batch sampler, sampler and dataset, each with a set_epoch
        # of its own (a seedable sampler x drives itself is the epoch source, not told twice).
        told: list[Any] = []
        for obj in (source, inner, dataset):  # by identity: datasets need not be hashable
            if obj is not None and obj is not self._epochs and all(obj is not seen for seen in told):
                told.append(obj)
        self._epoch_hooks = [f for f in (getattr(obj, "set_epoch", None) for obj in told) if callable(f)]
        self._init_kwargs = {
            "sharding": sharding,
            "device": device,
            "non_blocking": non_blocking,
            "gradient_state": self.gradient_state,
            "epoch_source": self._epochs,
            "seed": seed,
            "skip_batches": skip_batches,
            "use_stateful_dataloader": use_stateful_dataloader,
            "use_seedable_sampler": use_seedable_sampler,
            **dataloader_kwargs,
        }

    # DataLoader.__init__ assigns ``batch_size`` and ``sampler``; these properties keep what it
    # assigns (its iterators rely on ``sampler``) but show users the per-process batch size and the
    # real sampler, not the placeholder DataLoader makes when handed a batch sampler.
    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this process."""
        size = self.__dict__.get("_underlying_batch_size", self.__dict__.get("_raw_batch_size"))
        if size is not None and self.__dict__.get("split_batches"):
            return size // self.num_processes
        return size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self.__dict__["_raw_batch_size"] = value

    @property
    def sampler(self) -> Any:
        exposed = self.__dict__["_exposed_sampler"]
        return exposed if exposed is not None else self.__dict__["_raw_sampler"]

    @sampler.setter
    def sampler(self, value: Any) -> None:
        self.__dict__["_raw_sampler"] = value

    @property
    def _index_sampler(self) -> Any:
        # What DataLoader's iterators read indices from: read one item ahead (see ``IndexPeek``).
        source = DataLoader._index_sampler.fget(self)  # type: ignore[attr-defined]
        peek = self.__dict__.get("_peek")
        if peek is None or peek.source is not source:
            peek = self.__dict__["_peek"] = IndexPeek(source)
        return peek

    @property
    def total_batch_size(self) -> int | None:
        """Samples per global step, all processes together (``None`` when batches vary)."""
        return self.sharding.total_batch_size(self._underlying_batch_size)

    @property
    def seed(self) -> int | None:
        """The shuffle seed (``None`` without a seedable sampler)."""
        if isinstance(self._epochs, SeedableRandomSampler):
            return self._epochs.seed
        return self._seed

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the one the next iteration will run."""
        running = self._cursor.epoch
        return running if running is not None else self._epochs.epoch

    iteration = property(lambda s: s.epoch, lambda s, epoch: s.set_epoch(epoch), doc="Accelerate's name for ``epoch``.")

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch``: the shuffle order, and the ``set_epoch`` of the user's
        batch sampler, sampler and dataset (each that has one), as Accelerate's loaders call them."""
        self._epochs.set_epoch(epoch)
        for tell in self._epoch_hooks:
            tell(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands, as JSON-able values.

        ``batches_yielded`` counts the batches of the current epoch this process has handed out
        (skipped ones included); it is 0 once an epoch has run to its end. ``stream_batches``
        counts the batches of the underlying loader the epoch's steps have used, all processes
        together: what lets a run resume at another world size. With the user's
        generator, ``generators`` holds its state where the epoch of the next batch begins; with
        ``use_seedable_sampler=False``, ``sampler_seed`` the seed the running epoch's shuffle drew.
        """
        cursor = self._cursor
        state = {
            "epoch": self.epoch,
            "seed": self.seed,
            "batches_yielded": cursor.position,
            "num_processes": self.num_processes,
            "stream_batches": cursor.offset + cursor.position * self._stream_per_step(self.num_processes),
        }
        # On the epoch's last batch the next batch is the next epoch's (see load_state_dict).
        finished = cursor.done and self._epoch_length() is not None
        state.update(self._rng.state_dict(mid_epoch=cursor.epoch is not None and not finished))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch and seed; with ``use_stateful_dataloader`` also resume at the next batch.

        Without ``use_stateful_dataloader`` the next iteration starts the saved epoch from its
        beginning: pass ``state_dict()["batches_yielded"]``, read after loading, to
        :func:`skip_first_batches` to continue. A state saved on an epoch's last batch loads as
        the start of the next epoch (``batches_yielded`` 0).

        Saved with another number of processes (an elastic job that lost or gained a machine), the
        epoch goes on where the saved world's steps ended in the stream every world shares: each
        sample of the epoch is still used once (see :meth:`_resume_in_world`).
        """
        position, offset = int(state.get("batches_yielded", 0)), 0
        saved_world = int(state.get("num_processes", self.num_processes))
        if saved_world != self.num_processes and position:
            stream = state.get("stream_batches")
            stream = position * self._stream_per_step(saved_world) if stream is None else int(stream)
            position, offset = self._resume_in_world(stream, saved_world)
        length = self._epoch_length() if position or offset else None
        # Saved on the epoch's last batch: nothing of that epoch is left, and the uninterrupted run
        # went on with the next one. Resuming there (rather than replaying an empty epoch, or the
        # whole saved epoch for a loop that resumes by step count) is what makes resume exact.
        finished = length is not None and position >= length
        self._epochs.set_epoch(int(state["epoch"]) + finished)
        if finished:
            position, offset = 0, self._drop_stream_skip()
        seed = state.get("seed")
        if seed is not None:
            self._seed = int(seed)
            if isinstance(self._epochs, SeedableRandomSampler):
                self._epochs.seed = int(seed)
        self._rng.load_state_dict(state, mid_epoch=not finished)
        self._cursor.position, self._cursor.offset = position, offset
        if self.use_stateful_dataloader:
            self._resume = max(0, position - self.skip_batches)

    def _stream_per_step(self, world: int) -> int:
        """Batches of the underlying loader one step uses, all processes together."""
        return 1 if self.split_batches else world

    def _resume_in_world(self, stream: int, saved_world: int) -> tuple[int, int]:
        """``(batches_yielded, stream offset)`` here for a state that had used ``stream`` batches.

        Exact when the steps of this world end where the saved ones did; otherwise the epoch
        restarts at the step boundary before (up to ``num_processes - 1`` batches are used twice).
        """
        per_step = self._stream_per_step(self.num_processes)
        if stream % per_step:
            warnings.warn(
                f"loader state saved with {saved_world} processes ends mid-step for {self.num_processes}: "
                f"{stream % per_step} batch(es) of this epoch will be used twice",
                stacklevel=3,
            )
        return stream // per_step, 0

    def _stream_skip(self) -> int:
        """Stream batches the next iteration drops before dealing (a resume at another world size)."""
        return 0

    def _drop_stream_skip(self) -> int:
        return 0

    def __len__(self) -> int:
        # The epoch's length, as Accelerate's: a resumed position (load_state) does not shorten it,
        # so loops sized by len(loader) after resuming run the whole epoch's count.
        return max(0, self._rank_length() - self.skip_batches)

    def _epoch_length(self) -> int | None:
        """Batches of a whole epoch on this process, skipped ones included (None: unknown)."""
        try:
            return len(self) + self.skip_batches
        except (TypeError, NotImplementedError):  # an iterable dataset without __len__
            return None

    def _rank_length(self) -> int:
        """Batches this process yields in a whole epoch."""
        samples: int | None  # unknown for a sampler without a length
        if self._iterable:
            samples = len(self.dataset)  # type: ignore[arg-type]
            size = self._underlying_batch_size
            count = samples if size is None else (samples // size if self.drop_last else math.ceil(samples / size))
        else:
            source = self._base_index_source()
            count = len(source)
            index_sampler = getattr(_unwrap(source), "sampler", None)
            samples = len(index_sampler) if isinstance(index_sampler, Sized) else None
        size = self._underlying_batch_size
        return rank_batch_count(
            count,
            self.sharding,
            drop_last=self._underlying_drop_last,
            batch_size=size,
            # a short last batch exists only if the loader keeps it
            last_batch_size=samples % size if samples is not None and size and not self._underlying_drop_last else None,
        )

    def _base_index_source(self) -> Any:
        return self.batch_sampler if self.batch_sampler is not None else self.__dict__["_raw_sampler"]

    def _steps(self) -> Iterator[tuple[list[Any], int]]:
        """Global steps built from this loader's own (unsharded) batches."""
        return global_steps(
            DataLoader.__iter__(self),
            self.sharding,
            batch_size=self._underlying_batch_size,
            drop_last=self._underlying_drop_last,
            ops=_TENSOR_OPS,
        )

    def _rank_batches(self, skip: int) -> Iterator[tuple[Any, bool, int]]:
        """``(batch, is this rank's last, real samples of its step)`` for this rank."""
        raise NotImplementedError

    def _fast_source(self, skip: int) -> tuple[Iterator[Any], int]:
        """The DataLoader iterator for the direct path, and how many of its batches to drop."""
        return DataLoader.__iter__(self), self.skip_batches + skip

    def _last_remainder(self, batch: Any) -> int:
        size = find_batch_size(batch)
        return size if size is not None else -1

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        cursor = self._cursor
        epochs = self._epochs
        epoch = epochs.epoch
        rng = self._rng
        # Before the DataLoader iterator exists: starting it draws the workers' base seed.
        rng.begin(self, self._seed, epoch)
        resume, self._resume = self._resume, 0
        position = self.skip_batches + resume
        cursor.epoch, cursor.position, cursor.done = epoch, position, False
        cursor.offset = self._stream_skip()
        self.end_of_dataloader = False
        self.remainder = -1
        for tell in self._epoch_hooks:
            tell(epoch)
        # Batches move only to a device other than the CPU (``_move``); None leaves them where loaded.
        device, non_blocking = (self.device if self._move else None), self.non_blocking
        # Across processes with uneven batches "the last global step" has no single size.
        uneven = self.num_processes > 1 and not self.even_batches
        self.gradient_state._add_dataloader(self)
        completed = False
        try:
            if self._fast:
                iterator, drop = self._fast_source(resume)
                peek = None if self._iterable else self.__dict__.get("_peek")
                steps: Iterator[tuple[Any, bool, int | None]] = (
                    (batch, last, None) for batch, last in batches_with_last(iterator, drop, peek)
                )
            else:
                steps = self._rank_batches(self.skip_batches + resume)
            for batch, last, real in steps:
                rng.started()  # the sampler has read its generator: the user's sampler is given back
                if last:
                    self.remainder = -1 if uneven else (self._last_remainder(batch) if real is None else real)
                    self.end_of_dataloader = True
                if device is not None:
                    batch = send_to_device(batch, device, non_blocking=non_blocking)
                position += 1
                cursor.position, cursor.done = position, last
                note_batch(batch, self.gradient_state.num_steps)  # an OOM's one line names its shapes
                yield batch
            completed = True
        finally:
            rng.started()
            self.gradient_state._remove_dataloader(self)
            cursor.epoch, cursor.done = None, False
            if completed:
                epochs.set_epoch(epoch + 1)
                cursor.position = cursor.offset = 0
            elif epochs.epoch == epoch + 1:
                # The sampler ran to its end ahead of the loader (look-ahead, worker prefetch) but
                # the loop stopped early: the epoch is not over.
                epochs.set_epoch(epoch)

    def _copy_kwargs(self, num_batches: int) -> dict[str, Any]:
        kwargs = dict(self._init_kwargs)
        kwargs["seed"] = self.seed  # load_state_dict may have changed it since construction
        kwargs["skip_batches"] = self.skip_batches + num_batches
        return kwargs

    def _share_position(self, clone: PreparedLoader) -> PreparedLoader:
        # The copy walks the original's epoch: the original's state_dict (what a checkpoint of the
        # training run saves) follows it.
        clone._cursor = self._cursor
        clone._rng = self._rng  # and replays the draws a loaded state holds
        return clone

    def _with_skip(self, num_batches: int) -> PreparedLoader:
        return self._share_position(type(self)(self.dataset, **self._copy_kwargs(num_batches)))


class DataLoaderShard(PreparedLoader):
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
        >>> from x_runtime.data.loader import prepare_data_loader
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

    def _with_skip(self, num_batches: int) -> PreparedLoader:
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


class DataLoaderDispatcher(PreparedLoader):
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
        >>> from x_runtime.data.loader import prepare_data_loader
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
        self._copies = self.sharding.copies
        self._fast = self.num_processes == 1 and self._copies == 1

    def _rank_batches(self, skip: int) -> Iterator[tuple[Any, bool, int]]:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("dispatch_batches with more than one process needs torch.distributed initialized")
        copies = self._copies
        if dist.get_world_size() != self.num_processes * copies or dist.get_rank() // copies != self.process_index:
            raise RuntimeError(
                f"dispatch_batches sends over the default process group: rank {dist.get_rank()} of "
                f"{dist.get_world_size()} cannot act as process {self.process_index} of {self.num_processes}"
            )
        if dist.get_rank() == 0:
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
                _scatter([_Failure(f"{type(error).__name__}: {error}")] * (processes * self._copies))
                raise

        current = fetch()
        while current is not None:
            upcoming = fetch()
            entries, real = current
            shares = [
                (entry, upcoming is None or upcoming[0][rank] is None, real) for rank, entry in enumerate(entries)
            ]
            # Every rank of a tensor or context parallel group gets its group's share.
            messages: list[Any] = [shares[rank // self._copies] for rank in range(processes * self._copies)]
            own, messages[0] = messages[0], 0  # rank 0 keeps its share rather than pickling it to itself
            messages[1:] = [(_compact(entry), last, real) for entry, last, real in messages[1:]]
            _scatter(messages)
            if own[0] is not None:
                yield own
            current = upcoming
        _scatter([None] * (processes * self._copies))

    def _receive(self) -> Iterator[tuple[Any, bool, int]]:
        while True:
            message = _scatter(None)
            if message is None:
                return
            if isinstance(message, _Failure):
                raise RuntimeError(f"rank 0 failed to load the next batch: {message.text}")
            if message[0] is not None:
                yield message
