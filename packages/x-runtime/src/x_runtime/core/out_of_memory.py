"""An out-of-memory error as one line: what ran out, with which batch, what to try, where the traceback is.

A CUDA OOM hours into a run arrives as a page of traceback through autograd whose one useful line
("Tried to allocate 2.00 GiB") says neither which batch did it nor what to change; on CPU the
allocator's ``RuntimeError`` is worse. x's exit hook (``core/one_line_errors.py``) prints instead:

    error: out of memory on rank 0 (cpu) with batch {input_ids: 8x4096 int64}: peak 21.7 GiB of
    23.4 GiB; try a batch of 4 with gradient_accumulation_steps=2 (the same 8 examples per optimizer
    step), activation checkpointing, or the settings `x-estimate MODEL --plan` finds; traceback in
    /tmp/x-oom/rank0-4242.log

The prepared data loaders note each batch's shapes as they hand it out (a few microseconds, no
reference kept: holding the batch would keep it in memory past the loop). The traceback still
reaches the terminal with the run's debug setting.
"""

from __future__ import annotations

import itertools
import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

import torch

from x_common import env

__all__ = ["describe_out_of_memory", "first_on_host", "is_out_of_memory", "note_batch", "note_planned_peak"]

_MAX_LEAVES = 6


class _Seen:
    """What the last batch looked like, and the run's accumulation (for the advice)."""

    shapes: ClassVar[list[tuple[str, tuple[int, ...], str]]] = []
    accumulation: ClassVar[int] = 1
    planned: ClassVar[int | None] = None  # the memory guard's planned peak for the batch running


def _leaves(batch: Any, name: str, found: list[tuple[str, tuple[int, ...], str]]) -> None:
    if len(found) >= _MAX_LEAVES:
        return
    if isinstance(batch, torch.Tensor):
        found.append((name, tuple(batch.shape), str(batch.dtype).removeprefix("torch.")))
    elif isinstance(batch, Mapping):
        # The first few entries only: a batch that is a long list of strings costs no more.
        for key, value in itertools.islice(batch.items(), _MAX_LEAVES):
            _leaves(value, str(key), found)
    elif isinstance(batch, (list, tuple)):
        for index, value in enumerate(itertools.islice(batch, _MAX_LEAVES)):
            _leaves(value, f"{name}[{index}]" if name else str(index), found)


def note_batch(batch: Any, accumulation: int = 1) -> None:
    """Remember the shapes of the batch a prepared loader hands out (not the batch itself).

    Args:
        batch: the batch, as the loop receives it.
        accumulation: micro-batches per optimizer step, so the advice keeps the examples per step.
    """
    found: list[tuple[str, tuple[int, ...], str]] = []
    _leaves(batch, "", found)
    _Seen.shapes = found
    _Seen.accumulation = max(1, int(accumulation))


def note_planned_peak(nbytes: int | None) -> None:
    """Remember x-estimate's planned peak for the batch now running (the memory guard's), for the line."""
    _Seen.planned = nbytes


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure: CUDA's (and other accelerators') or CPU's."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"


def _device_and_peak(error: BaseException) -> tuple[str, str]:
    if isinstance(error, torch.OutOfMemoryError) and torch.cuda.is_available() and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        return f"cuda:{index}", f"peak {_gib(torch.cuda.max_memory_reserved(index))} reserved of {_gib(total)}"
    if isinstance(error, torch.OutOfMemoryError) and torch.accelerator.is_available():
        kind = torch.accelerator.current_accelerator()
        if kind is not None and kind.type != "cuda":  # XPU, MPS: no peak x reads there yet
            return kind.type, f"no peak figure on {kind.type}"
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "cpu", f"peak {_gib(peak)} resident"
    return "cpu", f"peak {_gib(peak)} resident of {_gib(total)}"


def _batch_text() -> str:
    if not _Seen.shapes:
        return ""
    parts = [
        f"{name + ': ' if name else ''}{'x'.join(map(str, shape)) or 'scalar'} {dtype}"
        for name, shape, dtype in _Seen.shapes
    ]
    return " with batch {" + ", ".join(parts) + "}"


def _advice() -> str:
    # The batch size as core.nested.find_batch_size reads it: the first tensor's first dimension.
    size = next((shape[0] for _, shape, _ in _Seen.shapes if shape), None)
    steps = _Seen.accumulation
    ways = []
    if size is not None and size > 1:
        ways.append(
            f"a batch of {size // 2} with gradient_accumulation_steps={steps * 2} "
            f"(the same {size * steps} examples per optimizer step)"
            if size % 2 == 0
            else f"a smaller batch than {size} with more gradient_accumulation_steps"
        )
    ways += ["activation checkpointing", "the settings `x-estimate MODEL --plan` finds"]
    return "try " + ", ".join(ways[:-1]) + ", or " + ways[-1]


_SAME_FAILURE_SECONDS = 60  # ranks of one agent that run out within this long are one failure


def _oom_folder() -> Path:
    return Path(tempfile.gettempdir()) / "x-oom"


def _agent_key() -> str:
    """The process that started this rank (torchrun's agent, srun's step daemon), with its start time."""
    parent = os.getppid()
    try:
        started = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    return f"{parent}-{started}"


def first_on_host() -> bool:
    """Whether this rank is the first of its agent's ranks to run out of memory (its line is the group's).

    Ranks started together run out together (the same batch shapes, the same model): eight lines
    saying one thing bury it. The first rank to create the agent's marker speaks; a marker older
    than a minute is an earlier failure (an elastic restart), and this one speaks again.
    """
    marker = _oom_folder() / f"agent-{_agent_key()}"
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        try:
            if time.time() - marker.stat().st_mtime < _SAME_FAILURE_SECONDS:
                return False
            os.utime(marker)
        except OSError:
            pass
        return True
    except OSError:
        return True


def _write_traceback(
    rank: int, kind: type[BaseException], error: BaseException, tb: TracebackType | None
) -> Path | None:
    folder = _oom_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{rank}-{os.getpid()}.log"
        path.write_text("".join(traceback.format_exception(kind, error, tb)))
    except OSError:
        return None
    return path


def describe_out_of_memory(rank: int, kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> str:
    """The one line for an allocation failure; writes its traceback to a log file it names."""
    device, peak = _device_and_peak(error)
    if _Seen.planned is not None:
        peak += f" (planned {_gib(_Seen.planned)} for the batch)"
    logged = _write_traceback(rank, kind, error, tb)
    where = f"traceback in {logged}" if logged else f"the traceback is shown with {env.DEBUG_MODE.name}=1"
    return f"out of memory on rank {rank} ({device}){_batch_text()}: {peak}; {_advice()}; {where}"
