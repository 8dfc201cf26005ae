"""``patch_environment``: set environment variables for the length of a block, as Accelerate's does."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["patch_environment"]


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set each keyword (upper-cased) to ``str(value)`` in ``os.environ``; restore on exit.

    A variable that existed gets its old value back, one that did not is removed again.

    Examples:
        >>> with patch_environment(x_doc_example="1"):
        ...     os.environ["X_DOC_EXAMPLE"]
        '1'
        >>> "X_DOC_EXAMPLE" in os.environ
        False
    """
    existing: dict[str, str] = {}
    for key, value in kwargs.items():
        key = key.upper()
        if key in os.environ:
            existing[key] = os.environ[key]
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key in kwargs:
            key = key.upper()
            if key in existing:
                os.environ[key] = existing[key]
            else:
                os.environ.pop(key, None)
