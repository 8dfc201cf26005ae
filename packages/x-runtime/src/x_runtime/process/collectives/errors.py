"""The error every process raises together when a collective's inputs disagree across processes, and the
warning for nested tensors ``pad_across_processes`` leaves as they are."""

from __future__ import annotations

__all__ = ["CannotPadNestedTensorWarning", "DistributedOperationException"]


class DistributedOperationException(ValueError):
    """Processes passed inputs a collective cannot combine (shapes, structures, lengths).

    Raised on every process at once, naming what each process passed; a ``ValueError``, so code
    that caught the shape check's ``ValueError`` keeps working (Accelerate's derives from
    ``Exception``).
    """


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested (jagged) tensor: it has no one size to pad, so it comes back unchanged."""
