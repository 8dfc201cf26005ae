"""An integer broadcast from one process, started now and read later.

``prepare`` shares a shuffle seed from rank 0. Waiting for that broadcast inside ``prepare`` puts
one collective round trip on the setup's critical path (about 0.4 ms on gloo over loopback, a few
percent of a small model's DDP setup); started asynchronously it travels while the script goes on,
and the first reader (the sampler's first iteration, a ``state_dict``) waits only for what is left.
Collectives run in the order every rank issues them, so later collectives are unaffected.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from x_runtime.process.collectives.transfer import meta_device, object_group, source_rank

__all__ = ["SharedInt", "share_int"]


class SharedInt:
    """``from_process``'s integer once the broadcast has arrived: ``result()`` waits for it once."""

    def __init__(self, box: torch.Tensor, work: Any) -> None:
        self._box: torch.Tensor | None = box  # released once the value is read
        self._work = work
        self._value: int | None = None

    def result(self) -> int:
        if self._value is None:
            if self._work is not None:
                self._work.wait()
            assert self._box is not None  # released only together with setting _value
            self._value = int(self._box.item())
            self._box = self._work = None
        return self._value

    def __int__(self) -> int:
        return self.result()

    def __index__(self) -> int:
        return self.result()

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        # Copied or pickled (a sampler in a checkpoint, a deepcopy), it is the number itself.
        return int, (self.result(),)

    def __repr__(self) -> str:
        return f"SharedInt({self._value if self._value is not None else 'pending'})"


def share_int(value: int, from_process: int = 0) -> SharedInt:
    """Start broadcasting ``from_process``'s ``value`` (an int64) to every process; returns at once."""
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    box = torch.tensor([int(value)], dtype=torch.int64)
    if world == 1:
        return SharedInt(box, None)
    source = source_rank("broadcast_int", from_process, world)
    group = object_group()  # under XLA a gloo group beside it, whose tensors live on the CPU
    if group is None:
        box = box.to(meta_device())
    return SharedInt(box, dist.broadcast(box, src=source, group=group, async_op=True))
