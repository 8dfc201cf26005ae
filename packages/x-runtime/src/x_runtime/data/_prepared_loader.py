"""What every prepared loader shares: epoch and position bookkeeping, checkpoint state, the
iteration protocol that knows the last batch ahead (``_lookahead``), and registration with the
gradient state.

``loaders`` builds on it: ``DataLoaderShard`` (every process reads its share) and
``DataLoaderDispatcher`` (the main process reads and sends).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from x_runtime.core.nested import concat_batches, find_batch_size, send_to_device, slice_batch
from x_runtime.data._lookahead import IndexPeek, batches_with_last
from x_runtime.data._position import _Cursor, _EpochCounter
from x_runtime.data.epoch_rng import EpochRandomness
from x_runtime.data.gradient_state import GradientState
from x_runtime.data.loader_state import DataLoaderStateMixin, StatefulLook
from x_runtime.data.samplers import BatchSamplerShard, SeedableRandomSampler, SkipBatchSampler, check_split
from x_runtime.data.sharding import Sharding
from x_runtime.data.steps import BatchOps, global_steps, rank_batch_count

_TENSOR_OPS = BatchOps(find_batch_size, concat_batches, slice_batch)


def _unwrap(source: Any) -> Any:
    while isinstance(source, (SkipBatchSampler, BatchSamplerShard)):
        source = source.batch_sampler
    return source


class _PreparedLoader(StatefulLook, DataLoaderStateMixin, DataLoader):
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
        # What DataLoader's iterators read indices from: read one item ahead (see ``_lookahead``).
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

    def _share_position(self, clone: _PreparedLoader) -> _PreparedLoader:
        # The copy walks the original's epoch: the original's state_dict (what a checkpoint of the
        # training run saves) follows it.
        clone._cursor = self._cursor
        clone._rng = self._rng  # and replays the draws a loaded state holds
        return clone

    def _with_skip(self, num_batches: int) -> _PreparedLoader:
        return self._share_position(type(self)(self.dataset, **self._copy_kwargs(num_batches)))
