"""Accelerate's test helpers that other libraries' test suites import (``accelerate.test_utils.testing``).

PEFT's tests ask ``get_backend()`` which device to test on and run example scripts with
``run_command``; served from here, those suites run against x.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from x_runtime.core.imports import (
    is_cuda_available,
    is_hpu_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_npu_available,
    is_sdaa_available,
    is_torch_xla_available,
    is_xpu_available,
)

__all__ = ["SubprocessCallException", "get_backend", "run_command"]


def get_backend() -> tuple[str, int, Callable[..., Any]]:
    """``(device type, device count, memory-allocated function)`` of the accelerator tests run on.

    Examples:
        >>> import torch
        >>> get_backend()[:2] if not torch.cuda.is_available() else ("cpu", 1)
        ('cpu', 1)
    """
    if is_torch_xla_available():
        return "xla", torch.cuda.device_count(), torch.cuda.memory_allocated
    if is_cuda_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if is_mps_available():
        return "mps", 1, torch.mps.current_allocated_memory
    for kind, available in (
        ("mlu", is_mlu_available),
        ("sdaa", is_sdaa_available),
        ("musa", is_musa_available),
        ("npu", is_npu_available),
        ("xpu", is_xpu_available),
        ("hpu", is_hpu_available),
    ):
        if available():
            module = getattr(torch, kind)
            return kind, module.device_count(), module.memory_allocated
    return "cpu", 1, lambda *args, **kwargs: 0


class SubprocessCallException(Exception):
    """A command ``run_command`` ran failed; the message holds its output."""


def run_command(
    command: Sequence[str | os.PathLike[str]], return_stdout: bool = False, env: Mapping[str, str] | None = None
) -> str | None:
    """Run ``command`` (stderr folded into stdout); its output when ``return_stdout``.

    Raises:
        SubprocessCallException: the command failed; the message quotes the command and its output.
    """
    argv = [str(part) if isinstance(part, Path) else part for part in command]
    try:
        output = subprocess.check_output(argv, stderr=subprocess.STDOUT, env=dict(os.environ if env is None else env))
    except subprocess.CalledProcessError as exc:
        shown = " ".join(str(part) for part in argv)
        raise SubprocessCallException(
            f"Command `{shown}` failed with the following error:\n\n{exc.output.decode()}"
        ) from exc
    return output.decode("utf-8") if return_stdout else None
