"""Accelerate's ``IterableDatasetShard``: one process's samples of an iterable dataset.

x's prepared loaders shard iterable datasets themselves (``steps.global_steps``); this class is
for code that builds the shard by hand, with Accelerate's arguments and order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

__all__ = ["IterableDatasetShard"]


class IterableDatasetShard(IterableDataset):
    """The samples of ``dataset`` that fall to ``process_index``, batch by batch.

    The dataset is read in global batches of ``batch_size * num_processes`` samples (with
    ``split_batches``, of ``batch_size``); this process yields its contiguous slice of each. An
    incomplete last global batch is dropped with ``drop_last``, else completed with samples from
    the first global batch, so every process yields the same number of samples: a round multiple
    of its batch size.

    Args:
        dataset: The iterable dataset to shard.
        batch_size: Samples per batch of one process (with ``split_batches``: of all processes).
        drop_last: Drop the incomplete last global batch rather than completing it.
        num_processes: Processes sharing the dataset.
        process_index: This process.
        split_batches: Cut each batch between the processes rather than dealing whole batches.

    Examples:
        >>> list(IterableDatasetShard(range(8), batch_size=2, num_processes=2, process_index=1))
        [2, 3, 6, 7]
        >>> list(IterableDatasetShard(range(8), batch_size=4, num_processes=2, process_index=1, split_batches=True))
        [2, 3, 6, 7]
        >>> list(IterableDatasetShard(range(5), batch_size=2, num_processes=2, process_index=1))
        [2, 3, 1, 2]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size > 1 and batch_size % num_processes != 0:
            raise ValueError(
                f"IterableDatasetShard with split_batches=True needs the batch size ({batch_size}) to be a round "
                f"multiple of the number of processes ({num_processes})"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch and pass it to the dataset's own ``set_epoch``, if it has one."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Samples this process yields (the dataset must have a length)."""
        step, share = self._step_and_share()
        batches = len(self.dataset) // step if self.drop_last else math.ceil(len(self.dataset) / step)
        return batches * share

    def _step_and_share(self) -> tuple[int, int]:
        """Samples of one global batch, and this process's part of it."""
        if self.split_batches:
            return self.batch_size, self.batch_size // self.num_processes
        return self.batch_size * self.num_processes, self.batch_size

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)  # the epoch's order, as no set_epoch carries it
        step, share = self._step_and_share()
        mine = slice(self.process_index * share, (self.process_index + 1) * share)
        first: list[Any] | None = None
        group: list[Any] = []
        for sample in self.dataset:
            group.append(sample)
            if len(group) == step:
                yield from group[mine]
                if first is None:
                    first = group
                group = []
        if group and not self.drop_last:
            filler = first if first is not None else list(group)
            while len(group) < step:
                group.extend(filler)
            yield from group[mine]
