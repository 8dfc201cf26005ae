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
import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from x_runtime._prepared_loader import (
    _loader_settings,
    _PreparedLoader,
)
from x_runtime.gradient_state import GradientState
from x_runtime.nested import apply
from x_runtime.samplers import (
    BatchSamplerShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "prepare_data_loader",
    "skip_first_batches",
]


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
    if isinstance(dataloader, _PreparedLoader) or hasattr(dataloader, "_with_skip"):  # prepared, or on XLA
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
        from x_runtime.collectives import broadcast_object_list

        seed = int(broadcast_object_list([seed], from_process=0)[0])
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
