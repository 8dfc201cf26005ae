"""Where a prepared loader stands: its epoch (when no sampler holds it) and its place in the epoch."""

from __future__ import annotations


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
