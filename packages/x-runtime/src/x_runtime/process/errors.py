"""The error every process raises together when a collective's inputs disagree across processes."""

from __future__ import annotations

__all__ = ["DistributedOperationException"]


class DistributedOperationException(ValueError):
    """Processes passed inputs a collective cannot combine (shapes, structures, lengths).

    Raised on every process at once, naming what each process passed; a ``ValueError``, so code
    that caught the shape check's ``ValueError`` keeps working (Accelerate's derives from
    ``Exception``).
    """
