"""Prepared dataloaders: one global order of batches, dealt out to the ranks of a data-parallel run.

:func:`prepare_data_loader` rebuilds a user's ``DataLoader`` so that each rank yields its share
of every global step (see :func:`x_runtime.samplers.global_steps` for the rule), plus what the
training loop needs around it:

- **Map-style datasets** are sharded at the index level (:class:`~x_runtime.samplers.BatchSamplerShard`):
  a rank loads and collates only its own samples.
- **Iterable datasets** cannot be indexed. Either every rank iterates the whole loader and keeps
  its share of each step (``dispatch_batches=False``), or rank 0 alone iterates it and sends each
  rank its share (``dispatch_batches=True``, the default for them).
- **Shuffling** goes through :class:`~x_runtime.samplers.SeedableRandomSampler`, whose order is a
  function of ``(seed, epoch)``: all ranks agree without synchronising RNG states every epoch.
- **Loop bookkeeping**: the loader registers with a ``GradientState`` while it iterates, raises
  ``end_of_dataloader`` just before the last batch and reports in ``remainder`` how many samples of
  the last global step are real rather than padding.
- **Resuming**: ``state_dict``/``load_state_dict`` carry the epoch, seed and position;
  :func:`skip_first_batches` (or ``use_stateful_dataloader=True``) continues at the next batch.

The prepared classes subclass ``torch.utils.data.DataLoader`` (code that checks
``isinstance(loader, DataLoader)`` keeps working) and wrap its iterator in one generator, whose
per-batch work is a counter update and, off the CPU, ``send_to_device``.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
import warnings
from collections.abc import Iterator, Mapping, Sized
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from x_runtime.gradient_state import GradientState
from x_runtime.nested import apply, concat_batches, find_batch_size, send_to_device, slice_batch
from x_runtime.samplers import (
    BatchOps,
    BatchSamplerShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    _mix_seed,
    check_split,
    global_steps,
    rank_batch_count,
)

_WORKER_SEED_SALT = 0x5EED_0F_10ADE2  # worker seeds differ from the shuffle seed of the same epoch

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "prepare_data_loader",
    "skip_first_batches",
]

# DataLoader settings a rebuilt loader keeps (``in_order`` and ``pin_memory_device`` depend on
# the torch version). Sampling settings are absent: the rebuilt loader gets its own sampler.
_KEPT_SETTINGS = tuple(
    name
    for name in (
        "num_workers",
        "collate_fn",
        "pin_memory",
        "timeout",
        "worker_init_fn",
        "multiprocessing_context",
        "generator",
        "prefetch_factor",
        "persistent_workers",
        "pin_memory_device",
        "in_order",
    )
    if name in inspect.signature(DataLoader.__init__).parameters
)

_END = object()


def _loader_settings(loader: DataLoader) -> dict[str, Any]:
    return {name: getattr(loader, name) for name in _KEPT_SETTINGS if hasattr(loader, name)}


_TENSOR_OPS = BatchOps(find_batch_size, concat_batches, slice_batch)


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
    __slots__ = ("epoch", "position")

    def __init__(self) -> None:
        self.position = 0
        self.epoch: int | None = None


def _unwrap(source: Any) -> Any:
    while isinstance(source, (SkipBatchSampler, BatchSamplerShard)):
        source = source.batch_sampler
    return source


class _PreparedLoader(DataLoader):
    """What both prepared loaders share: bookkeeping, epochs, state and the iteration protocol."""

    _fast = True  # iterate the DataLoader directly (else ``_rank_batches`` produces the batches)

    def __init__(
        self,
        dataset: Any,
        *,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
        device: torch.device | str | None = None,
        non_blocking: bool = False,
        gradient_state: GradientState | None = None,
        epoch_source: Any = None,
        seed: int | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        **dataloader_kwargs: Any,
    ) -> None:
        if num_processes < 1 or not 0 <= process_index < num_processes:
            raise ValueError(f"process_index {process_index} is not in range for {num_processes} processes")
        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        self.__dict__["_exposed_sampler"] = None
        super().__init__(dataset, **dataloader_kwargs)
        self._iterable = isinstance(dataset, IterableDataset)
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
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
        check_split(self._underlying_batch_size, num_processes, split_batches)
        self.device = torch.device(device) if device is not None else None
        # Batches come out of a DataLoader on the CPU: a CPU target needs no walk over the batch.
        self._move = self.device is not None and self.device.type != "cpu"
        self.non_blocking = non_blocking
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self._epochs = epoch_source if epoch_source is not None else _EpochCounter()
        self._seed = seed
        self._own_generator = dataloader_kwargs.get("generator") is None
        self.skip_batches = int(skip_batches)
        self.use_stateful_dataloader = use_stateful_dataloader
        self.end_of_dataloader = False
        self.remainder = -1
        self._resume = 0
        self._cursor = _Cursor()
        dataset_set_epoch = getattr(dataset, "set_epoch", None)
        self._dataset_set_epoch = dataset_set_epoch if callable(dataset_set_epoch) else None
        self._init_kwargs = {
            "num_processes": num_processes,
            "process_index": process_index,
            "split_batches": split_batches,
            "even_batches": even_batches,
            "device": device,
            "non_blocking": non_blocking,
            "gradient_state": self.gradient_state,
            "epoch_source": self._epochs,
            "seed": seed,
            "skip_batches": skip_batches,
            "use_stateful_dataloader": use_stateful_dataloader,
            **dataloader_kwargs,
        }

    # DataLoader.__init__ assigns ``batch_size`` and ``sampler``; these properties keep what it
    # assigns (its iterators rely on ``sampler``) but show users the per-process batch size and the
    # real sampler, not the placeholder DataLoader makes when handed a batch sampler.
    @property
    def batch_size(self) -> int | None:  # type: ignore[override]
        """Samples per batch on this process."""
        size = self.__dict__.get("_underlying_batch_size", self.__dict__.get("_raw_batch_size"))
        if size is not None and self.__dict__.get("split_batches"):
            return size // self.num_processes
        return size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self.__dict__["_raw_batch_size"] = value

    @property
    def sampler(self) -> Any:  # type: ignore[override]
        exposed = self.__dict__["_exposed_sampler"]
        return exposed if exposed is not None else self.__dict__["_raw_sampler"]

    @sampler.setter
    def sampler(self, value: Any) -> None:
        self.__dict__["_raw_sampler"] = value

    @property
    def total_batch_size(self) -> int | None:
        """Samples per global step, all processes together (``None`` when batches vary)."""
        size = self._underlying_batch_size
        return size if size is None or self.split_batches else size * self.num_processes

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

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` (shuffle order and the dataset's own ``set_epoch``)."""
        self._epochs.set_epoch(epoch)
        if self._dataset_set_epoch is not None:
            self._dataset_set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands, as JSON-able values.

        ``batches_yielded`` counts the batches of the current epoch this process has handed out
        (skipped ones included); it is 0 once an epoch has run to its end.
        """
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "batches_yielded": self._cursor.position,
            "num_processes": self.num_processes,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch and seed; with ``use_stateful_dataloader`` also resume at the next batch.

        Without ``use_stateful_dataloader`` the next iteration starts the saved epoch from its
        beginning: pass ``state["batches_yielded"]`` to :func:`skip_first_batches` to continue.
        """
        if state.get("num_processes", self.num_processes) != self.num_processes:
            warnings.warn(
                f"loader state saved with {state['num_processes']} processes, loaded with "
                f"{self.num_processes}: batches_yielded no longer matches the same samples",
                stacklevel=2,
            )
        self._epochs.set_epoch(int(state["epoch"]))
        seed = state.get("seed")
        if seed is not None:
            self._seed = int(seed)
            if isinstance(self._epochs, SeedableRandomSampler):
                self._epochs.seed = int(seed)
        position = int(state.get("batches_yielded", 0))
        self._cursor.position = position
        if self.use_stateful_dataloader:
            self._resume = max(0, position - self.skip_batches)

    def __len__(self) -> int:
        return max(0, self._rank_length() - self.skip_batches - self._resume)

    def _rank_length(self) -> int:
        """Batches this process yields in a whole epoch."""
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
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
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
            num_processes=self.num_processes,
            batch_size=self._underlying_batch_size,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
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
        if self._own_generator:
            # Starting a DataLoader iterator draws the workers' base seed from the loader's generator,
            # or from torch's global RNG when it has none: that draw would shift dropout and every
            # other random op after a resume. A generator of our own, seeded by (seed, epoch), leaves
            # the global RNG alone and gives workers the same seeds when an epoch is replayed.
            generator = torch.Generator()
            generator.manual_seed(_mix_seed(self._seed or 0, epoch) ^ _WORKER_SEED_SALT)
            self.generator = generator
        resume, self._resume = self._resume, 0
        position = self.skip_batches + resume
        cursor.epoch, cursor.position = epoch, position
        self.end_of_dataloader = False
        self.remainder = -1
        if self._dataset_set_epoch is not None:
            self._dataset_set_epoch(epoch)
        move, device, non_blocking = self._move, self.device, self.non_blocking
        # Across processes with uneven batches "the last global step" has no single size.
        uneven = self.num_processes > 1 and not self.even_batches
        self.gradient_state._add_dataloader(self)
        completed = False
        try:
            if self._fast:
                iterator, drop = self._fast_source(resume)
                for _ in range(drop):
                    if next(iterator, _END) is _END:
                        break
                current = next(iterator, _END)
                if current is not _END:
                    if move:
                        current = send_to_device(current, device, non_blocking=non_blocking)
                    # One batch of look-ahead: the last batch is known before it is handed out,
                    # and moving a batch overlaps with fetching the next one.
                    for upcoming in iterator:
                        position += 1
                        cursor.position = position
                        yield current
                        current = send_to_device(upcoming, device, non_blocking=non_blocking) if move else upcoming
                    self.remainder = -1 if uneven else self._last_remainder(current)
                    self.end_of_dataloader = True
                    cursor.position = position + 1
                    yield current
            else:
                for batch, last, real in self._rank_batches(self.skip_batches + resume):
                    if last:
                        self.remainder = -1 if uneven else real
                        self.end_of_dataloader = True
                    if move:
                        batch = send_to_device(batch, device, non_blocking=non_blocking)
                    position += 1
                    cursor.position = position
                    yield batch
            completed = True
        finally:
            self.gradient_state._remove_dataloader(self)
            cursor.epoch = None
            if completed:
                epochs.set_epoch(epoch + 1)
                cursor.position = 0
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
        return clone

    def _with_skip(self, num_batches: int) -> _PreparedLoader:
        return self._share_position(type(self)(self.dataset, **self._copy_kwargs(num_batches)))


class DataLoaderShard(_PreparedLoader):
    """A ``DataLoader`` yielding one process's share of every global step.

    Built by :func:`prepare_data_loader`. Map-style datasets are sharded by the batch sampler
    (a :class:`~x_runtime.samplers.BatchSamplerShard` under a
    :class:`~x_runtime.samplers.SkipBatchSampler`, added here when missing); for an iterable
    dataset every process iterates the whole loader and keeps its share of each step.

    Attributes:
        end_of_dataloader: True from just before the last batch is yielded until the next iteration.
        remainder: Real (not padding) samples of the last global step, once it is reached; ``-1``
            when unknown (uneven batches across processes).
        batch_size: Samples per batch on this process; ``total_batch_size``: all processes together.

    Examples:
        >>> loader = prepare_data_loader(DataLoader(list(range(5)), batch_size=2))
        >>> [batch.tolist() for batch in loader], loader.remainder, loader.end_of_dataloader
        ([[0, 1], [2, 3], [4]], 1, True)
    """

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        if not isinstance(dataset, IterableDataset):
            kwargs = self._sharded_sampling(dataset, kwargs)
        super().__init__(dataset, **kwargs)
        self._auto = self.batch_sampler is not None
        self._skipper: SkipBatchSampler | None = None
        self._shard: BatchSamplerShard | None = None
        if not self._iterable:
            self._skipper = self.batch_sampler if self._auto else self.__dict__["_raw_sampler"]
            inner = self._skipper.batch_sampler  # type: ignore[union-attr]
            self._shard = inner if isinstance(inner, BatchSamplerShard) else None
        self._fast = not self._iterable or self.num_processes == 1

    @staticmethod
    def _sharded_sampling(dataset: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Replace the sampling arguments by one skippable, sharded index source."""
        kwargs = dict(kwargs)
        processes = kwargs.get("num_processes", 1)
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
        if processes > 1 and not isinstance(source, BatchSamplerShard):
            source = BatchSamplerShard(
                source,
                processes,
                kwargs.get("process_index", 0),
                split_batches=kwargs.get("split_batches", False),
                even_batches=kwargs.get("even_batches", True),
            )
        skipper = SkipBatchSampler(source, kwargs.get("skip_batches", 0))
        if auto:
            kwargs["batch_sampler"] = skipper
        else:
            kwargs["sampler"], kwargs["batch_size"] = skipper, None
        return kwargs

    def __len__(self) -> int:
        if self._skipper is None:
            return super().__len__()
        return max(0, len(self._skipper) - self._resume)

    def _fast_source(self, skip: int) -> tuple[Iterator[Any], int]:
        if self._skipper is not None:
            self._skipper.skip_once = skip
            return DataLoader.__iter__(self), 0
        return DataLoader.__iter__(self), self.skip_batches + skip

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
        if self._auto:
            kwargs["batch_sampler"] = self._skipper.batch_sampler
        else:
            kwargs["sampler"], kwargs["batch_size"] = self._skipper.batch_sampler, None
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
        >>> class Numbers(IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(5))
        >>> loader = prepare_data_loader(DataLoader(Numbers(), batch_size=2))
        >>> type(loader).__name__, [batch.tolist() for batch in loader]
        ('DataLoaderDispatcher', [[0, 1], [2, 3], [4]])
    """

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


class _SkipIterableLoader(DataLoader):
    """A plain ``DataLoader`` over an iterable dataset whose first batches are loaded and dropped."""

    def __init__(self, dataset: Any, *, skip_batches: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return itertools.islice(super().__iter__(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader of the same kind yielding the current epoch's batches after the first ``num_batches``.

    For map-style datasets the skipped batches are dropped as index lists, never loaded; iterable
    datasets have to be read through them. A prepared loader's copy shares its sampler, epoch and
    gradient state: when the copy finishes the epoch, the original moves on to the next one. A
    plain ``DataLoader`` yields the same batches as its own next epoch only if its order is
    deterministic (a ``RandomSampler`` without a seeded generator reshuffles).

    Args:
        dataloader: A prepared loader or a plain ``DataLoader``.
        num_batches: Batches (of this process) to skip.

    Returns:
        The skipping loader.

    Examples:
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2))
        >>> [batch.tolist() for batch in skip_first_batches(loader, 2)]
        [[4, 5]]
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    if isinstance(dataloader, _PreparedLoader):
        return dataloader._with_skip(num_batches)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"expected a torch DataLoader, got {type(dataloader).__name__}")
    settings = _loader_settings(dataloader)
    dataset = dataloader.dataset
    if isinstance(dataset, IterableDataset):
        already = getattr(dataloader, "skip_batches", 0) if isinstance(dataloader, _SkipIterableLoader) else 0
        return _SkipIterableLoader(
            dataset,
            skip_batches=already + num_batches,
            batch_size=dataloader.batch_size,
            drop_last=dataloader.drop_last,
            **settings,
        )
    if dataloader.batch_sampler is not None:
        return DataLoader(dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches), **settings)
    return DataLoader(dataset, sampler=SkipBatchSampler(dataloader.sampler, num_batches), batch_size=None, **settings)


def _shared_seed(data_seed: int | None, generator: torch.Generator | None, num_processes: int) -> int:
    """The shuffle seed: ``data_seed``, else one draw broadcast from rank 0.

    Every rank draws (from the sampler's generator if it has one, else torch's global RNG) so that
    their RNG streams stay aligned; rank 0's draw wins.
    """
    if data_seed is not None:
        return int(data_seed)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    if num_processes > 1 and dist.is_available() and dist.is_initialized():
        box: list[Any] = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = int(box[0])
    return seed


def _seedable(source: Any, data_seed: int | None, num_processes: int) -> Any:
    """``source`` (a sampler or batch sampler) with its RandomSampler made seedable."""
    holder = None if isinstance(source, RandomSampler) else source
    sampler = source if holder is None else getattr(source, "sampler", None)
    if not isinstance(sampler, RandomSampler):
        return source
    if isinstance(sampler, SeedableRandomSampler):
        if data_seed is None:
            return source
        seeded = copy.copy(sampler)
        seeded.seed = int(data_seed)
    else:
        seeded = SeedableRandomSampler(
            sampler.data_source,
            replacement=sampler.replacement,
            num_samples=getattr(sampler, "_num_samples", None),
            seed=_shared_seed(data_seed, sampler.generator, num_processes),
        )
    if holder is None:
        return seeded
    if type(holder) is BatchSampler:
        return BatchSampler(seeded, holder.batch_size, holder.drop_last)
    holder = copy.copy(holder)  # a custom batch sampler: swap its sampler without touching the user's
    holder.sampler = seeded
    return holder


def prepare_data_loader(
    dataloader: DataLoader,
    *,
    num_processes: int = 1,
    process_index: int = 0,
    device: torch.device | str | None = None,
    split_batches: bool = False,
    even_batches: bool = True,
    dispatch_batches: bool | None = None,
    use_seedable_sampler: bool = True,
    data_seed: int | None = None,
    non_blocking: bool = False,
    gradient_state: GradientState | None = None,
    use_stateful_dataloader: bool = False,
) -> DataLoaderShard | DataLoaderDispatcher:
    """Rebuild ``dataloader`` so that this process yields its share of every global step.

    A global step is ``num_processes`` consecutive batches of ``dataloader`` (process ``i`` gets
    the ``i``-th), or with ``split_batches`` one batch cut into ``num_processes`` contiguous
    slices. Dataset, collate function, workers, pinning and the other DataLoader settings are kept.

    Args:
        dataloader: The loader to prepare (map-style or iterable dataset, any batch sampler).
        num_processes: Processes sharing the data.
        process_index: This process.
        device: Where batches go (``send_to_device``); ``None`` leaves them where they are loaded.
        split_batches: Cut each batch between the processes (its size must divide evenly) rather
            than dealing whole batches.
        even_batches: Fill an incomplete last global step with samples from the start of the epoch
            so every process gets a full batch and the same number of batches; ``remainder`` then
            tells how many samples of that step are real. ``False`` leaves some processes with a
            short batch or one batch fewer. A ``drop_last`` loader drops the incomplete step.
        dispatch_batches: Rank 0 alone iterates ``dataloader`` and sends the others their share
            (:class:`DataLoaderDispatcher`). Defaults to True for iterable datasets.
        use_seedable_sampler: Replace a ``RandomSampler`` by a :class:`SeedableRandomSampler`, so
            every process shuffles the same way each epoch.
        data_seed: Its seed; ``None`` draws one now from torch's RNG (the sampler's generator if it
            has one) on rank 0 and broadcasts it, so ``torch.manual_seed`` before this call fixes it.
        non_blocking: Asynchronous host-to-device copies (with ``pin_memory``).
        gradient_state: Where the loader registers while it iterates.
        use_stateful_dataloader: ``load_state_dict`` also makes the next iteration resume after the
            batches already yielded.

    Returns:
        A :class:`DataLoaderShard` or :class:`DataLoaderDispatcher`.

    Raises:
        ValueError: ``split_batches`` with a batch size that is unknown or not a multiple of
            ``num_processes``; an already prepared loader; a bad ``process_index``.

    Examples:
        >>> plain = DataLoader(list(range(10)), batch_size=2)
        >>> [b.tolist() for b in prepare_data_loader(plain, num_processes=2, process_index=1)]
        [[2, 3], [6, 7], [0, 1]]
        >>> [b.tolist() for b in prepare_data_loader(plain, num_processes=2, process_index=1, even_batches=False)]
        [[2, 3], [6, 7]]
    """
    if isinstance(dataloader, _PreparedLoader):
        raise ValueError("this dataloader is already prepared")
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"expected a torch DataLoader, got {type(dataloader).__name__}")
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    dispatch = iterable if dispatch_batches is None else bool(dispatch_batches)
    common: dict[str, Any] = {
        "num_processes": num_processes,
        "process_index": process_index,
        "split_batches": split_batches,
        "even_batches": even_batches,
        "device": device,
        "non_blocking": non_blocking,
        "gradient_state": gradient_state if gradient_state is not None else GradientState(),
        "use_stateful_dataloader": use_stateful_dataloader,
        **_loader_settings(dataloader),
    }
    loader_class = DataLoaderDispatcher if dispatch else DataLoaderShard
    if iterable:
        return loader_class(dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last, **common)
    auto = dataloader.batch_sampler is not None
    source = dataloader.batch_sampler if auto else dataloader.sampler
    if use_seedable_sampler:
        source = _seedable(source, data_seed, num_processes)
    sampling = {"batch_sampler": source} if auto else {"sampler": source, "batch_size": None}
    return loader_class(dataset, **sampling, **common)
