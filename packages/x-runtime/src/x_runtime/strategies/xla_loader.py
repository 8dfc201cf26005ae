"""A prepared loader whose batches reach the XLA device through torch_xla's ``ParallelLoader``.

``ParallelLoader`` reads the CPU loader in a thread, copies batches to the device in another and
cuts the lazy graph (``torch_xla.sync()``) each time the loop takes a batch. Its read-ahead (16
batches) breaks what a prepared loader reports by reading its own state: the CPU loader reaches
its last batch, or the end of the epoch, while the loop is still several batches behind. Used
naively (as Accelerate's ``MpDeviceLoaderWrapper`` does), ``end_of_dataloader`` turns true early
(gradients sync off an accumulation boundary, ``gather_for_metrics`` trims the wrong batch) and a
checkpoint records a position the loop has not reached.

So each batch travels with a number; the reader thread records, under that number, the flags and
position the CPU loader had when it handed the batch out, and this loader reports them when the
loop receives that batch. An exception in the dataset reaches the loop (``ParallelLoader`` would
print it in its thread and end the epoch early, silently).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch

from x_runtime.data.gradient_state import GradientState

__all__ = ["XLADeviceLoader"]


class _Place:
    """Where the loop is, shared by a loader and its ``skip_first_batches`` copies (as the CPU
    loaders share their cursor), so a checkpoint taken through the original sees the copy's place."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None  # the CPU loader's state_dict as of the last batch out


class _Numbered:
    """The CPU loader's batches as ``(number, batch)``, recording what the loader said of each."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.marks: dict[int, tuple[bool, int, dict[str, Any]]] = {}
        self.error: BaseException | None = None
        self.started = False
        self.finished = threading.Event()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        self.started = True
        loader = self.loader
        batches = None
        try:
            batches = iter(loader)
            for number, batch in enumerate(batches):
                self.marks[number] = (loader.end_of_dataloader, loader.remainder, loader.state_dict())
                yield number, batch
        except Exception as exc:  # handed to the loop: the reader thread would only print it
            self.error = exc
        finally:
            if batches is not None:
                batches.close()  # the CPU loader's own bookkeeping runs now, in this thread
            self.finished.set()


class XLADeviceLoader:
    """A prepared loader on an XLA device; everything else is the wrapped loader's.

    Args:
        loader: the prepared CPU loader (sharded; batches left on the CPU).
        device: the XLA device batches go to.
        gradient_state: the accelerator's; this loader registers there while it iterates.
    """

    def __init__(
        self, loader: Any, device: torch.device, gradient_state: GradientState, place: _Place | None = None
    ) -> None:
        self._loader = loader
        self.device = device
        self.gradient_state = gradient_state
        self.end_of_dataloader = False
        self.remainder = -1
        self._place = place if place is not None else _Place()

    def __iter__(self) -> Iterator[Any]:
        import torch_xla.distributed.parallel_loader as pl

        numbered = _Numbered(self._loader)
        parallel = pl.ParallelLoader(numbered, [self.device])
        self.end_of_dataloader, self.remainder = False, -1
        self.gradient_state._add_dataloader(self)
        completed = False
        try:
            for number, batch in parallel.per_device_loader(self.device):
                self.end_of_dataloader, self.remainder, self._place.state = numbered.marks.pop(number)
                yield batch
            if numbered.error is not None:
                raise numbered.error
            completed = True
        finally:
            self.gradient_state._remove_dataloader(self)
            parallel.close()  # stops and joins its threads
            if numbered.started:  # the reader finalises the CPU loader before its thread ends
                numbered.finished.wait(timeout=60)
            stopped_at, self._place.state = self._place.state, None
            if not completed and stopped_at is not None:
                # The reader ran ahead (perhaps to the epoch's end): the epoch and the position are
                # where the loop stopped, as with any prepared loader left early.
                self._loader._epochs.set_epoch(int(stopped_at["epoch"]))
                self._loader._cursor.position = int(stopped_at["batches_yielded"])

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def epoch(self) -> int:
        state = self._place.state
        return int(state["epoch"]) if state is not None else self._loader.epoch

    def state_dict(self) -> dict[str, Any]:
        """As the wrapped loader's, for the last batch the loop received (not the read-ahead)."""
        state = self._place.state
        return dict(state) if state is not None else self._loader.state_dict()

    def _with_skip(self, num_batches: int) -> XLADeviceLoader:
        return XLADeviceLoader(self._loader._with_skip(num_batches), self.device, self.gradient_state, self._place)

    def __getattr__(self, name: str) -> Any:
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        return f"XLADeviceLoader({self._loader!r}, device={self.device})"
