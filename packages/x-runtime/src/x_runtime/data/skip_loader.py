"""Accelerate's ``SkipDataLoader``: a ``DataLoader`` whose every epoch starts after its first batches.

:func:`~x_runtime.data.loader.skip_first_batches` is usually the better tool (it drops
skipped batches as index lists, never loading them); this class exists for code written against
Accelerate's constructor.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

from x_runtime.data.gradient_state import GradientState
from x_runtime.data.loader_state import DataLoaderStateMixin, StatefulLook, torchdata_class

__all__ = ["SkipDataLoader"]


def _yielded(state: Mapping[str, Any]) -> int:
    """Batches a torchdata ``StatefulDataLoader`` state says its epoch has handed out (0 at its end)."""
    if state.get("_iterator_finished"):
        return 0
    if "_num_yielded" in state:
        return int(state["_num_yielded"])
    main = (state.get("_snapshot") or {}).get("_main_snapshot") or {}  # with worker processes
    return int(main.get("_num_yielded", 0))


class SkipDataLoader(StatefulLook, DataLoaderStateMixin, DataLoader):
    """A ``DataLoader`` that loads and drops the first ``skip_batches`` batches of every epoch.

    Args:
        dataset: The dataset to load from.
        skip_batches: Batches dropped at the start of each epoch.
        use_stateful_dataloader: Load through a torchdata ``StatefulDataLoader`` (``base_dataloader``;
            needs torchdata 0.8 or newer): ``state_dict``/``load_state_dict`` are its own, and the
            loader passes ``isinstance(loader, StatefulDataLoader)``. Resuming from a state counts
            the batches that state had handed out as skipped already.
        **kwargs: The ``DataLoader`` arguments (``batch_size``, ``shuffle``, ``num_workers``...).

    Examples:
        >>> [batch.tolist() for batch in SkipDataLoader(list(range(8)), batch_size=2, skip_batches=2)]
        [[4, 5], [6, 7]]
    """

    def __init__(
        self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any
    ) -> None:
        stateful = torchdata_class() if use_stateful_dataloader else None
        if use_stateful_dataloader and stateful is None:
            raise ImportError("SkipDataLoader(use_stateful_dataloader=True) needs torchdata 0.8 or newer")
        super().__init__(dataset, **kwargs)
        self.skip_batches = int(skip_batches)
        self.use_stateful_dataloader = use_stateful_dataloader
        self.gradient_state = GradientState()
        self.end_of_dataloader = False
        self.remainder = -1
        self._resumed = 0  # batches of the running epoch a loaded state had handed out
        if stateful is not None:
            accepted = inspect.signature(stateful).parameters
            base_kwargs = {name: value for name, value in kwargs.items() if name in accepted}
            self.base_dataloader = stateful(dataset, **base_kwargs)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        base = self.base_dataloader
        batches = DataLoader.__iter__(self) if base is self else iter(base)
        skip, self._resumed = max(0, self.skip_batches - self._resumed), 0
        self.begin()
        try:
            yield from itertools.islice(batches, skip, None)
        finally:
            self.end()

    def __len__(self) -> int:
        base = self.base_dataloader
        return max(0, (DataLoader.__len__(self) if base is self else len(base)) - self.skip_batches)

    def state_dict(self) -> dict[str, Any]:
        """The ``StatefulDataLoader``'s state (skipped batches count as handed out)."""
        return dict(self._stateful_base().state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the next epoch where ``state`` stood; batches it had handed out are not skipped again."""
        self._stateful_base().load_state_dict(dict(state))
        self._resumed = _yielded(state)

    def _stateful_base(self) -> Any:
        if not self.use_stateful_dataloader:
            raise RuntimeError("SkipDataLoader keeps a state only with use_stateful_dataloader=True")
        return self.base_dataloader
