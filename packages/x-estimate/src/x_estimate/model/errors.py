"""Errors the estimator reports to the user as one line (no traceback unless --debug)."""

from __future__ import annotations

__all__ = ["EstimateError"]


class EstimateError(Exception):
    """A problem with the model or its source that the user can fix; the message says how."""
