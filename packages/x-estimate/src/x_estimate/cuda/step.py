"""What a ``device="cuda"`` simulation adds to the fake step: CUDA's kernels, workspaces, blocks.

The fake tensors stay on the CPU (``kernels.py`` says why); the step is made a CUDA
step by:

- ``CudaKernels``: SDPA's flash / memory-efficient / math choice and ``native_dropout``;
- 512-byte blocks: the ledger rounds every storage as the caching allocator does, so the
  allocated figure is ``torch.cuda.max_memory_allocated``'s;
- cuBLAS workspaces: torch gives each (thread, stream) that runs a matmul a workspace from the
  caching allocator, 32 MiB on Hopper (sm90; ``CUBLAS_WORKSPACE_CONFIG=:4096:8``), kept for the
  life of the process. The forward runs on the main thread and the backward on autograd's device
  thread, so a training loop holds two: 64 MiB, which is what an H200 holds beyond weights and
  AdamW state between steps (tests/data/gpu_truth_h200.json);
- the reserved figure: the step's allocations replayed through ``CachingAllocator`` twice (the
  second step meets the segments the first left), after the weights and optimizer state.

AdamW's multi-tensor (foreach) step, CUDA's default, is chosen in ``simulate/step.py``; the copies
PyTorch makes around cuDNN's convolutions are counted by ``simulate/convolutions.py``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

import torch

from x_estimate.cuda.caching_allocator import MIN_BLOCK, replay

__all__ = ["CUBLAS_WORKSPACE", "WORKSPACES", "CudaStep", "Event", "device_reserved"]

CUBLAS_WORKSPACE = 32 << 20  # per (thread, stream), sm90's default
WORKSPACES = 2  # the forward's thread and autograd's backward thread


class CudaStep:
    """The CUDA parts of one simulated step; every method is a no-op when not ``enabled``."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.block = MIN_BLOCK if enabled else 1
        self._kernels: Any = None
        self._workspaces: list[torch.Tensor] = []

    def kernels(self) -> Any:
        if not self.enabled:
            return contextlib.nullcontext()
        from x_estimate.cuda.kernels import CudaKernels

        self._kernels = CudaKernels()
        return self._kernels

    @property
    def recompute_context(self) -> Any:
        """For activation checkpointing: a factory of the kernels' mode for each recomputed block
        (its calls are not counted again), or None on the CPU."""
        if not self.enabled:
            return None
        from x_estimate.cuda.kernels import CudaKernels

        return CudaKernels

    def allocate_workspaces(self, ledger: Any) -> None:
        """Two cuBLAS workspaces, live before the step as they are from a loop's first step on."""
        if not self.enabled:
            return
        before, ledger.phase = ledger.phase, "workspace"
        self._workspaces = [torch.empty(CUBLAS_WORKSPACE, dtype=torch.uint8) for _ in range(WORKSPACES)]
        ledger.phase = before

    def release_workspaces(self) -> None:
        self._workspaces = []

    def notes(self) -> list[str]:
        if not self.enabled:
            return []
        out = [f"CUDA step: {WORKSPACES} cuBLAS workspaces of {CUBLAS_WORKSPACE >> 20} MiB counted as temporaries"]
        if self._kernels is not None and self._kernels.backends:
            counts = Counter(self._kernels.backends)
            out.append("SDPA kernel: " + ", ".join(f"{name} ({n} calls)" for name, n in sorted(counts.items())))
        return out

    def reserved(self, events: list[Event]) -> int | None:
        """The caching allocator's reserved bytes after two steps; None when not simulating CUDA."""
        if not self.enabled:
            return None
        return device_reserved(events)


# (+1 allocated / -1 freed, the allocation's key, bytes, phase, index of its part in simulate.PARTS)
Event = tuple[int, int, int, str, int]


def device_reserved(
    events: list[Event],
    divisors: Sequence[int] = (),
    skip_phases: Collection[str] = (),
    extra: int = 0,
    optimizer_parts: tuple[int, int] | None = None,
) -> int:
    """Reserved bytes after two steps of one device that holds a share of each part.

    ``divisors``: per part (the events' part index), the devices each tensor of it is divided
    over (FSDP and ZeRO shard every parameter and its state), 0 for a part not on the device
    (offloaded); ``skip_phases``: phases whose allocations happen elsewhere (an optimizer step
    on the CPU); ``extra``: one more block held throughout (a gathered unit);
    ``optimizer_parts``: (temporaries, optimizer state) indices: the optimizer step's
    temporaries are divided as its state (a sharded optimizer steps its shard).
    """
    skipped = {key for sign, key, _, phase, _ in events if sign > 0 and phase in skip_phases}
    shared: list[tuple[int, int, int, str]] = [(1, -1, extra, "setup")] if extra else []
    for sign, key, nbytes, phase, part in events:
        if optimizer_parts is not None and part == optimizer_parts[0] and phase == "optimizer":
            part = optimizer_parts[1]
        divisor = divisors[part] if part < len(divisors) else 1
        if divisor and key not in skipped:
            shared.append((sign, key, -(-nbytes // divisor), phase))
    return replay(*_first_and_later_steps(shared)).reserved


def _first_and_later_steps(
    flat: list[tuple[int, int, int, str]],
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The events of a loop's start as a real one runs them, and of its second step.

    The simulation primes the optimizer state before its one step; a real loop creates it
    during the first step's ``optimizer.step()``, in blocks the first backward just freed, so
    the second step's activations find the segments fragmented. The order replayed is: weights
    and workspaces, the step with the state allocated where its optimizer phase begins, then
    the step again.
    """
    start = next((i for i, e in enumerate(flat) if e[3] in ("inputs", "forward")), len(flat))
    setup = [e for e in flat[:start] if e[3] != "optimizer"]
    primed = [e for e in flat[:start] if e[3] == "optimizer"]
    freed = {e[1] for e in primed if e[0] < 0}
    state = [e for e in primed if e[0] > 0 and e[1] not in freed]  # what the priming step left: the state
    step = flat[start:]
    at = next((i for i, e in enumerate(step) if e[3] == "optimizer"), len(step))
    first = [*setup, *step[:at], *state, *step[at:]]
    return [e[:3] for e in first], [e[:3] for e in step]
