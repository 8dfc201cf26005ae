"""Version comparisons with Accelerate's names: ``compare_versions``, ``is_torch_version``.

Versions compare as packaging's ``Version`` does (``2.13.0+cpu >= 2.13``), through torch's own
``TorchVersion``, so no other dependency is needed.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import torch
from torch.torch_version import TorchVersion

from x_runtime.core.constants import STR_OPERATION_TO_FUNC

__all__ = ["compare_versions", "is_torch_version"]

_OPERATIONS: dict[str, Callable[[Any, Any], bool]] = STR_OPERATION_TO_FUNC


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """Whether a library's installed version (by distribution name), or a version, ``operation`` a requirement.

    Args:
        library_or_version: a distribution name (``"torch"``) or a version (a string of digits, or a
            ``packaging.version.Version``).
        operation: one of ``>``, ``>=``, ``==``, ``!=``, ``<=``, ``<``.
        requirement_version: the version to compare with.

    Raises:
        ValueError: an unknown operation (the message lists the known ones).
        importlib.metadata.PackageNotFoundError: no distribution of that name is installed.

    Examples:
        >>> compare_versions("torch", ">=", "2.0")
        True
        >>> compare_versions("1.10.0", "<", "1.9")
        False
    """
    compare = _OPERATIONS.get(operation)
    if compare is None:
        raise ValueError(f"`operation` must be one of {list(_OPERATIONS)}, received {operation}")
    version = str(library_or_version)
    if isinstance(library_or_version, str) and not version[:1].isdigit():
        version = importlib.metadata.version(library_or_version)
    return compare(TorchVersion(version), requirement_version)


def is_torch_version(operation: str, version: str) -> bool:
    """``compare_versions`` of this torch (``torch.__version__``) with ``version``.

    Examples:
        >>> is_torch_version(">=", "2.0"), is_torch_version("<", "2.0")
        (True, False)
    """
    return compare_versions(str(torch.__version__), operation, version)
