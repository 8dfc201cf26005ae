"""How a prepared loader knows its last batch before handing it out, without loading the next one.

``end_of_dataloader`` must be set while the last batch is in the user's hands. Accelerate's loaders
fetch one batch ahead to know it, which runs the next batch's dataset reads and ``collate_fn``
before the user's step: whatever they draw from the global RNG (a masking collator, a random
augmentation) is then in the state a ``save_state`` between the two batches captures, and a
resumed run draws it a second time for the same batch. Resume is no longer exact.

For a map-style dataset the look-ahead is on the index lists instead (:class:`IndexPeek`): the
batch sampler is read one list ahead, so the loader knows which batch is the last while the next
batch is neither loaded nor collated until it is asked for. Iterable datasets have no index lists:
the look-ahead there is on batches, as Accelerate's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["IndexPeek", "batches_with_last"]

_END = object()


class IndexPeek:
    """An index source read one item ahead; ``exhausted`` once no item follows the last one handed out.

    Examples:
        >>> peek = IndexPeek([[0, 1], [2]])
        >>> items = iter(peek)
        >>> next(items), peek.exhausted, next(items), peek.exhausted
        ([0, 1], False, [2], True)
    """

    def __init__(self, source: Iterable[Any]) -> None:
        self.source = source
        self.handed = 0
        self.exhausted = False

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        # Re-iterable: a persistent-workers DataLoader iterator keeps this object across epochs.
        self.handed, self.exhausted = 0, False
        items = iter(self.source)
        current = next(items, _END)
        self.exhausted = current is _END
        while current is not _END:
            upcoming = next(items, _END)
            self.exhausted = upcoming is _END
            self.handed += 1
            yield current
            current = upcoming


def batches_with_last(iterator: Iterator[Any], drop: int, peek: IndexPeek | None) -> Iterator[tuple[Any, bool]]:
    """``(batch, is it the last)`` for the batches of ``iterator`` after the first ``drop``.

    With ``peek`` (the index source ``iterator`` reads), a batch is the last when the source has
    run out and every list it handed out has come back as a batch (workers read lists ahead);
    without, the next batch is fetched ahead.
    """
    received = 0
    for _ in range(drop):
        if next(iterator, _END) is _END:
            return
        received += 1
    if peek is not None:
        for batch in iterator:
            received += 1
            yield batch, peek.exhausted and received == peek.handed
        return
    current = next(iterator, _END)
    if current is _END:
        return
    for upcoming in iterator:
        yield current, False
        current = upcoming
    yield current, True
