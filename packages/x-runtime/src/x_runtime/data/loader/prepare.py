"""Prepared dataloaders: one global order of batches, dealt out to the ranks of a data-parallel run.

:func:`prepare_data_loader` rebuilds a user's ``DataLoader`` so that each rank yields its share
of every global step (see :func:`x_runtime.data.steps.global_steps` for the rule), plus what the
training loop needs around it:

- **Map-style datasets** are sharded at the index level (:class:`~x_runtime.data.samplers.BatchSamplerShard`):
  a rank loads and collates only its own samples.
- **Iterable datasets** cannot be indexed. Either every rank iterates the whole loader and keeps
  its share of each step (``dispatch_batches=False``), or rank 0 alone iterates it and sends each
  rank its share (``dispatch_batches=True``, the default for them).
- **Shuffling** draws from torch's global RNG as Accelerate's default does (one process: as plain
  torch; several: the sampler gets a generator, seeded by one global draw here and given rank 0's
  state at every epoch start), so a script keeps its random numbers after migrating. With
  ``use_seedable_sampler=True`` it goes through
  :class:`~x_runtime.data.samplers.SeedableRandomSampler` instead, whose order is a function of
  ``(seed, epoch)``: all ranks agree without synchronising RNG states, and epochs draw nothing
  from the global RNG.
- **Loop bookkeeping**: the loader registers with a ``GradientState`` while it iterates, raises
  ``end_of_dataloader`` just before the last batch and reports in ``remainder`` how many samples of
  the last global step are real rather than padding.
- **Resuming**: ``state_dict``/``load_state_dict`` carry the epoch, seed and position;
  :func:`skip_first_batches` (or ``use_stateful_dataloader=True``) continues at the next batch.

The prepared classes (``loaders``) subclass ``torch.utils.data.DataLoader`` (code that checks
``isinstance(loader, DataLoader)`` keeps working) and wrap its iterator in one generator, whose
per-batch work is a counter update and, off the CPU, ``send_to_device``. ``LoaderSpec`` is how
the accelerator asks a strategy for a prepared loader: everything but the device and the
gradient state, which the strategy supplies.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from x_runtime.data.gradient_state import GradientState
from x_runtime.data.loader.loaders import DataLoaderDispatcher, DataLoaderShard, PreparedLoader
from x_runtime.data.samplers import BatchSamplerShard, SeedableRandomSampler, SkipBatchSampler
from x_runtime.data.sharding import Sharding

if TYPE_CHECKING:
    from x_runtime.process.collectives.shared_int import SharedInt

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "LoaderSpec",
    "SeedableRandomSampler",
    "Sharding",
    "SkipBatchSampler",
    "prepare_data_loader",
    "prepare_sharded_loader",
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


def _loader_settings(loader: DataLoader) -> dict[str, Any]:
    return {name: getattr(loader, name) for name in _KEPT_SETTINGS if hasattr(loader, name)}


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
    if isinstance(dataloader, PreparedLoader) or hasattr(dataloader, "_with_skip"):  # prepared, or on XLA
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


def _shared_seed(data_seed: int | None, num_processes: int) -> int | SharedInt:
    """The shuffle seed: ``data_seed``, else ``torch.initial_seed()`` as in Accelerate, rank 0's.

    Nothing is drawn from any RNG (Accelerate draws nothing here either, so the global stream of a
    migrated script stays Accelerate's). Every rank takes rank 0's seed: the same as its own when
    the ranks were seeded alike (``set_seed``), and the same order where they were not, which
    Accelerate does not ensure. The broadcast is started here and waited for by the sampler's first
    read of its seed (``SharedInt``), not inside ``prepare``.
    """
    if data_seed is not None:
        return int(data_seed)
    seed = torch.initial_seed()
    if num_processes > 1 and dist.is_available() and dist.is_initialized():
        from x_runtime.process.collectives.shared_int import share_int

        # An unseeded process's initial seed is any 64-bit value: sent as a signed int64, read back unsigned.
        return share_int(seed - 2**64 if seed >= 2**63 else seed, from_process=0)
    return seed


def _give_generator(source: Any) -> None:
    """Give the sampler under ``source`` a generator seeded by one global draw, if it has none.

    Accelerate 1.15 does this at ``prepare`` for several processes without the seedable sampler (on
    the user's sampler); the loader then gives every rank rank 0's state at each epoch start. The
    same draw here keeps the global RNG stream of a migrated script.
    """
    sampler: Any = getattr(source, "sampler", None)  # a batch sampler's (Accelerate's ``get_sampler``)
    if hasattr(sampler, "generator") and sampler.generator is None:
        sampler.generator = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))


def _seedable(source: Any, data_seed: int | None, num_processes: int) -> Any:
    """``source`` (a sampler or batch sampler) with its RandomSampler made seedable."""
    holder = None if isinstance(source, RandomSampler) else source
    sampler = source if holder is None else getattr(source, "sampler", None)
    if not isinstance(sampler, RandomSampler):
        return source
    if sampler.generator is not None and not isinstance(sampler, SeedableRandomSampler):
        # The user's generator drives the order, as in a plain loop over the same loader; the
        # prepared loader gives every rank rank 0's generator state at each epoch start.
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
            seed=_shared_seed(data_seed, num_processes),
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
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool | None = None,
    rng_types: Any = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Any = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    *,
    gradient_state: GradientState | None = None,
) -> DataLoaderShard | DataLoaderDispatcher:
    """Rebuild ``dataloader`` so that this process yields its share of every global step.

    A global step is ``num_processes`` consecutive batches of ``dataloader`` (process ``i`` gets
    the ``i``-th), or with ``split_batches`` one batch cut into ``num_processes`` contiguous
    slices. Dataset, collate function, workers, pinning and the other DataLoader settings are kept.

    Args:
        dataloader: The loader to prepare (map-style or iterable dataset, any batch sampler).
        device: Where batches go (``send_to_device``); ``None`` leaves them where they are loaded.
        num_processes: Processes sharing the data; ``None``: the world size of the initialized
            default process group (1 without one), as Accelerate takes it from its state.
        process_index: This process; ``None``: its rank in that group.
        put_on_device: ``False`` leaves batches where they are loaded even with ``device`` given
            (Accelerate's default); ``None`` or ``True`` moves them to ``device``.
        rng_types: Accepted for Accelerate's signature; x needs none (a seedable sampler, or the
            user's generator synchronized from rank 0 at each epoch start).
        split_batches: Cut each batch between the processes (its size must divide evenly) rather
            than dealing whole batches.
        even_batches: Fill an incomplete last global step with samples from the start of the epoch
            so every process gets a full batch and the same number of batches; ``remainder`` then
            tells how many samples of that step are real. ``False`` leaves some processes with a
            short batch or one batch fewer. A ``drop_last`` loader drops the incomplete step.
        dispatch_batches: Rank 0 alone iterates ``dataloader`` and sends the others their share
            (:class:`DataLoaderDispatcher`). Defaults to True for iterable datasets.
        use_seedable_sampler: Replace a ``RandomSampler`` by a :class:`SeedableRandomSampler`, so
            every process shuffles the same way each epoch whatever the global RNG did. Off (the
            default, as Accelerate's): the global RNG is drawn as Accelerate draws it.
        data_seed: Its seed; ``None`` takes ``torch.initial_seed()`` of rank 0 (as Accelerate, but the
            same on every rank), so ``set_seed``/``torch.manual_seed`` before this call fixes it.
        non_blocking: Asynchronous host-to-device copies (with ``pin_memory``).
        use_stateful_dataloader: ``load_state_dict`` also makes the next iteration resume after the
            batches already yielded.
        slice_fn_for_dispatch: Accelerate's; not supported (must be ``None``).
        torch_device_mesh: Accelerate's; not supported (must be ``None``).
        gradient_state: Where the loader registers while it iterates.

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
    if isinstance(dataloader, PreparedLoader):
        raise ValueError("this dataloader is already prepared")
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"expected a torch DataLoader, got {type(dataloader).__name__}")
    for name, value in (("slice_fn_for_dispatch", slice_fn_for_dispatch), ("torch_device_mesh", torch_device_mesh)):
        if value is not None:
            raise NotImplementedError(f"prepare_data_loader: {name} is not supported by x_runtime")
    if num_processes is None or process_index is None:
        from x_runtime.process.collectives import rank, world_size

        num_processes = world_size() if num_processes is None else num_processes
        process_index = rank() if process_index is None else process_index
    if put_on_device is False:
        device = None
    return prepare_sharded_loader(
        dataloader,
        Sharding(num_processes, process_index, split_batches, even_batches),
        device=device,
        dispatch_batches=dispatch_batches,
        use_seedable_sampler=use_seedable_sampler,
        data_seed=data_seed,
        non_blocking=non_blocking,
        gradient_state=gradient_state,
        use_stateful_dataloader=use_stateful_dataloader,
    )


def prepare_sharded_loader(
    dataloader: DataLoader,
    sharding: Sharding,
    *,
    device: torch.device | str | None = None,
    dispatch_batches: bool | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    gradient_state: GradientState | None = None,
    use_stateful_dataloader: bool = False,
) -> DataLoaderShard | DataLoaderDispatcher:
    """:func:`prepare_data_loader` with the sharding given as one :class:`Sharding`.

    Examples:
        >>> plain = DataLoader(list(range(10)), batch_size=2)
        >>> [b.tolist() for b in prepare_sharded_loader(plain, Sharding(num_processes=2, process_index=0))]
        [[0, 1], [4, 5], [8, 9]]
    """
    if isinstance(dataloader, PreparedLoader):
        raise ValueError("this dataloader is already prepared")
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"expected a torch DataLoader, got {type(dataloader).__name__}")
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    dispatch = iterable if dispatch_batches is None else bool(dispatch_batches)
    common: dict[str, Any] = {
        "sharding": sharding,
        "device": device,
        "non_blocking": non_blocking,
        "gradient_state": gradient_state if gradient_state is not None else GradientState(),
        "use_stateful_dataloader": use_stateful_dataloader,
        **_loader_settings(dataloader),
    }
    common["use_seedable_sampler"] = use_seedable_sampler
    loader_class = DataLoaderDispatcher if dispatch else DataLoaderShard
    if iterable:
        return loader_class(dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last, **common)
    auto = dataloader.batch_sampler is not None
    source = dataloader.batch_sampler if auto else dataloader.sampler
    if use_seedable_sampler:
        source = _seedable(source, data_seed, sharding.num_processes)
    elif sharding.num_processes > 1 and not dispatch:
        _give_generator(source)
    sampling = {"batch_sampler": source} if auto else {"sampler": source, "batch_size": None}
    return loader_class(dataset, **sampling, **common)


@dataclass(frozen=True)
class LoaderSpec:
    """A loader to prepare, as the accelerator asks for it; the strategy adds device and gradient state.

    Examples:
        >>> spec = LoaderSpec(DataLoader(list(range(4)), batch_size=2), Sharding(num_processes=2, process_index=1))
        >>> [b.tolist() for b in spec.build(device=None, gradient_state=GradientState())]
        [[2, 3]]
    """

    dataloader: DataLoader
    sharding: Sharding = field(default_factory=Sharding)
    dispatch_batches: bool | None = None
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def replace(self, **changes: Any) -> LoaderSpec:
        """A copy with ``changes`` (e.g. ``dispatch_batches=False``)."""
        return dataclasses.replace(self, **changes)

    def build(
        self, *, device: torch.device | str | None, gradient_state: GradientState | None
    ) -> DataLoaderShard | DataLoaderDispatcher:
        """The prepared loader: batches go to ``device``; it reports to ``gradient_state``."""
        return prepare_sharded_loader(
            self.dataloader,
            self.sharding,
            device=device,
            dispatch_batches=self.dispatch_batches,
            use_seedable_sampler=self.use_seedable_sampler,
            data_seed=self.data_seed,
            non_blocking=self.non_blocking,
            gradient_state=gradient_state,
            use_stateful_dataloader=self.use_stateful_dataloader,
        )
