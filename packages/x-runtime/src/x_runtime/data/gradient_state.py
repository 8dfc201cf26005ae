"""What the training loop is in the middle of: accumulation boundary and the active dataloader.

One ``GradientState`` belongs to one ``Accelerator`` (no class-level sharing). Prepared
dataloaders register while they iterate, so the accelerator knows when the last batch is out
(gradients must sync there even off an accumulation boundary) and how many samples of that last
global batch are real rather than padding (``gather_for_metrics`` drops the padding).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["GradientState", "TrackedLoader"]


class TrackedLoader(Protocol):
    end_of_dataloader: bool
    remainder: int


class GradientState:
    """Accumulation bookkeeping shared by one accelerator's optimizers, schedulers and loaders."""

    def __init__(self, *, num_steps: int = 1, sync_with_dataloader: bool = True, adjust_scheduler: bool = True):
        self.num_steps = check_steps(num_steps)
        self.sync_with_dataloader = sync_with_dataloader
        self.adjust_scheduler = adjust_scheduler
        self.sync_gradients = True
        self._loaders: list[TrackedLoader] = []
        # The accumulation plugin's non-default options, as Accelerate keeps them (transformers' Trainer
        # reads "sync_each_batch" here).
        self.plugin_kwargs: dict[str, Any] = {}

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        """Whether the next backward synchronises; transformers' ``Trainer`` decides it itself and sets it here."""
        self.sync_gradients = sync_gradients

    @property
    def active_dataloader(self) -> TrackedLoader | None:
        return self._loaders[-1] if self._loaders else None

    @property
    def in_dataloader(self) -> bool:
        return bool(self._loaders)

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_dataloader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch of the active loader; -1 when unknown."""
        loader = self.active_dataloader
        return -1 if loader is None else int(loader.remainder)

    def _add_dataloader(self, loader: TrackedLoader) -> None:
        self._loaders.append(loader)

    def _remove_dataloader(self, loader: TrackedLoader) -> None:
        for index in range(len(self._loaders) - 1, -1, -1):
            if self._loaders[index] is loader:
                del self._loaders[index]
                return

    def __repr__(self) -> str:
        return (
            f"GradientState(num_steps={self.num_steps}, sync_gradients={self.sync_gradients}, "
            f"end_of_dataloader={self.end_of_dataloader}, remainder={self.remainder})"
        )


def check_steps(steps: object) -> int:
    """``steps`` as a count of micro-batches per optimizer step: an int >= 1, or a clear error."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {steps!r}")
    return steps
