"""``Sharding``: how the batches of one loader are dealt out to the processes of a data-parallel run.

One frozen value carries what every part of the data path needs to agree on: the prepared
loaders, the index-level sampler shard and the rule that groups batches into global steps. The
public functions and classes that keep Accelerate's signatures take the four loose keyword
arguments and build a ``Sharding`` once, where they are called.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Sharding"]


@dataclass(frozen=True)
class Sharding:
    """Which share of every global step this process gets.

    Args:
        num_processes: Processes sharing the data.
        process_index: This process, in ``[0, num_processes)``.
        split_batches: A global step is one batch cut into ``num_processes`` slices (the batch
            size is the global one); otherwise it is ``num_processes`` consecutive batches.
        even_batches: Pad an incomplete last global step from the start of the epoch, so every
            process gets the same number of full batches.
        copies: Ranks that read each share (a tensor or context parallel group, neighbours in rank
            order): the world is ``num_processes * copies`` ranks, rank ``r`` reading share ``r // copies``.

    Raises:
        ValueError: ``process_index`` is not a process of ``num_processes``.

    Examples:
        >>> Sharding(num_processes=2, process_index=1).per_step
        2
        >>> Sharding(num_processes=2, process_index=1, split_batches=True).per_step
        1
    """

    num_processes: int = 1
    process_index: int = 0
    split_batches: bool = False
    even_batches: bool = True
    copies: int = 1

    def __post_init__(self) -> None:
        if self.num_processes < 1 or not 0 <= self.process_index < self.num_processes:
            raise ValueError(f"process_index {self.process_index} is not in range for {self.num_processes} processes")

    @property
    def per_step(self) -> int:
        """Underlying batches per global step."""
        return 1 if self.split_batches else self.num_processes

    def total_batch_size(self, batch_size: int | None) -> int | None:
        """Samples per global step, all processes together, for loader batches of ``batch_size``."""
        return batch_size if batch_size is None or self.split_batches else batch_size * self.num_processes
