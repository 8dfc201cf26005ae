"""One training step's real memory peak: CUDA's allocator statistics, or the CPU allocator's events.

On a CUDA device the caching allocator keeps peak statistics; ``reset_peak_memory_stats`` at the
step's start and ``max_memory_allocated``/``max_memory_reserved`` at its end are the step's peak.

The CPU allocator keeps no statistics, and the process's resident size is the wrong figure to
hold a plan to: memory that the model's construction freed stays resident in malloc's arenas and
is reused by the step, so RSS grows 2-11% less than the tensors the step holds (measured on
Llama, GPT-2 and BERT from configs). torch.profiler's allocation events (``profile_memory=True``)
are the allocator's own: every block the step allocates and frees, in order. Their running sum
is the step's growth; the tensors alive when it starts (weights, buffers, optimizer state,
gradients, the batch) are counted from their storages. The process's resident peak during the
step (VmHWM, reset at the start) is reported beside it: it is what the kernel's OOM killer sees.

The profiler prints two lines at start and stop (kineto's) and, once per process, a warning when a
block allocated before it is freed during it, which every step does (the previous step's
outputs). Those go to the run's stderr, where they would read as a problem: they are held back
while the profiler starts and stops, and anything else written meanwhile is passed on.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["MeasuredPeak", "StepMeasurement", "profiler_running", "storage_bytes"]

# What the profiler writes to stderr at its start and stop: kineto's trace markers and the
# CPU allocator's warning about blocks older than the profile.
_PROFILER_NOISE = re.compile(r"profiler_(start|stop)|Memory block of unknown size|^\s*$")


@dataclass(frozen=True)
class MeasuredPeak:
    """A step's peak on one device: allocated tensor bytes, and what the device held besides."""

    device: str
    allocated: int  # the most tensor bytes live at once during the step
    reserved: int | None  # CUDA: the caching allocator's segments at their largest
    resident: int | None  # CPU: the process's resident size at its largest during the step (Linux)
    baseline: int  # tensor bytes alive when the step began (weights, state, batch)


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (tied weights and views counted once)."""
    seen: dict[tuple[int, str], int] = {}
    for tensor in tensors:
        local = getattr(tensor, "_local_tensor", tensor)  # a DTensor (FSDP2's shards): this rank's part
        if not isinstance(local, torch.Tensor) or local.device.type == "meta":
            continue
        try:
            storage = local.untyped_storage()
            seen[(storage.data_ptr(), str(local.device))] = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            continue  # FSDP1's freed parameter storages, tensor subclasses without one: nothing held
    return sum(seen.values())


def profiler_running() -> bool:
    """Whether a torch profiler is recording in this process (one may run at a time)."""
    return bool(torch._C._autograd._profiler_enabled())


def _resident_peak() -> int | None:
    """This process's VmHWM in bytes (its resident size at its largest); None off Linux."""
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return None if found is None else int(found.group(1)) * 1024


def _reset_rss_peak() -> bool:
    # Writing 5 resets VmHWM to the current RSS (Linux 4.0+); without it the peak is the process's.
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _stderr_without_profiler_noise() -> Iterator[None]:
    """Hold back fd 2 for the block; pass on every line that is not the profiler's own."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        held_file = tempfile.TemporaryFile()  # noqa: SIM115 - entered below, once fd 2 is saved
    except OSError:
        os.close(saved)
        yield
        return
    with held_file as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().splitlines(keepends=True)
            kept = [line for line in lines if not _PROFILER_NOISE.search(line.decode(errors="replace"))]
            if kept:
                os.write(2, b"".join(kept))


class StepMeasurement:
    """Measure the memory of what runs between ``start`` and ``stop``, on ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._profiler: Any = None
        self._rss_reset = False
        self._baseline = 0

    def start(self, alive: Iterable[Any]) -> bool:
        """Begin; ``alive`` are the tensors the step starts with (weights, state, gradients, batch).

        False on CPU while another profiler runs (the user's, ``Accelerator.profile``): torch
        allows one at a time, so the step is not measured.
        """
        self._baseline = storage_bytes(alive)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return True
        if profiler_running():
            return False
        from torch.profiler import ProfilerActivity, profile

        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _stderr_without_profiler_noise():
            # The allocator warns once per process about a block older than the profile: one
            # such block freed here spends that warning where it is held back.
            older = torch.empty(1)
            self._profiler.__enter__()
            del older
        self._rss_reset = _reset_rss_peak()
        return True

    def stop(self) -> MeasuredPeak:
        """End the measurement; the step's figures."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return MeasuredPeak(
                str(self.device),
                int(torch.cuda.max_memory_allocated(self.device)),
                int(torch.cuda.max_memory_reserved(self.device)),
                None,
                self._baseline,
            )
        resident = _resident_peak() if self._rss_reset else None
        with _stderr_without_profiler_noise():
            self._profiler.__exit__(None, None, None)
        events = [e for e in self._profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
        self._profiler = None
        live = peak = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            live += event.nbytes()
            peak = max(peak, live)
        return MeasuredPeak(str(self.device), self._baseline + peak, None, resident, self._baseline)

    def cancel(self) -> None:
        """Stop without figures (the run ended, or the step failed)."""
        if self._profiler is not None:
            with contextlib.suppress(Exception), _stderr_without_profiler_noise():
                self._profiler.__exit__(None, None, None)
            self._profiler = None
