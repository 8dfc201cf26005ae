"""Accelerate's behaviour on real processes: gather with autograd, dataset shares, loader structure and defaults,
the user's generator, debug-mode shape checks, copy_tensor_to_devices, synchronize_rng_states.

Usage (under torchrun, gloo on CPU): ``accelerate_behaviour_worker.py OUT_DIR``. Each scenario records its
result or its error; the run goes on, so a failed check shows that every rank stayed in step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from _helpers import report
from torch.utils.data import DataLoader

from x_runtime.checkpoint import synchronize_rng_states
from x_runtime.data import prepare_data_loader
from x_runtime.process import collectives as c
from x_runtime.process import set_debug_mode
from x_runtime.process.operations.on_ranks import split_between_processes
from x_runtime.process.topology.state import ProcessState


def run(results: dict[str, Any], name: str, scenario: Callable[[], Any]) -> None:
    try:
        results[name] = {"ok": scenario()}
    except Exception as error:
        results[name] = {"error": type(error).__name__, "message": str(error)}


class CustomBatchSampler:
    def __init__(self, length: int, batch_size: int) -> None:
        self.length, self.batch_size = length, batch_size

    def __iter__(self):
        for start in range(0, self.length, self.batch_size):
            yield list(range(start, min(start + self.batch_size, self.length)))

    def __len__(self) -> int:
        return -(-self.length // self.batch_size)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    r, w = dist.get_rank(), dist.get_world_size()
    results: dict[str, Any] = {}
    grad = torch.full((2, 3), float(r + 1), requires_grad=True)
    run(results, "gather_grad", lambda: c.gather(grad * 1).tolist())
    run(results, "gather_leaf_grad", lambda: c.gather(grad).tolist())
    run(results, "gather_dict_grad", lambda: c.gather({"a": grad[:1] * 2, "b": grad.sum()})["b"].tolist())
    run(results, "reduce_grad", lambda: c.reduce(grad * 1, reduction="mean").tolist())
    run(results, "pad_grad", lambda: list(c.pad_across_processes(grad[: r + 1] * 1).shape))

    import datasets

    state = ProcessState(r, r, w, w, 0, torch.device("cpu"), "gloo", "MULTI_CPU", "test")

    def share(rows: int, padding: bool) -> Any:
        data = datasets.Dataset.from_list([{"k": v} for v in range(rows)])
        with split_between_processes(state, data, apply_padding=padding) as part:
            return [type(part).__name__, list(part["k"])]

    run(results, "split_even", lambda: share(2 * w, False))
    run(results, "split_odd", lambda: share(2 * w - 1, False))
    run(results, "split_odd_padded", lambda: share(2 * w - 1, True))

    def custom() -> Any:
        loader = prepare_data_loader(DataLoader(list(range(32)), batch_sampler=CustomBatchSampler(32, 8)))
        return [
            type(loader.batch_sampler).__name__,
            type(loader.batch_sampler.batch_sampler).__name__,
            [b.tolist() for b in loader],
        ]

    run(results, "custom_sampler", custom)

    def positional() -> Any:
        loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2), torch.device("cpu"), w, r)
        return [b.tolist() for b in loader]

    run(results, "positional", positional)

    def seedable_in_shard() -> Any:
        loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=1, shuffle=True), use_seedable_sampler=True)
        return type(loader.batch_sampler.batch_sampler.sampler).__name__

    run(results, "seedable_in_shard", seedable_in_shard)

    def generator_parity() -> Any:
        g = torch.Generator()
        prepared = prepare_data_loader(DataLoader(list(range(16)), batch_size=2, shuffle=True, generator=g))
        g.manual_seed(42)
        mine = [[b.tolist() for b in prepared] for _ in range(2)]
        g.manual_seed(42)
        plain = DataLoader(list(range(16)), batch_size=2 * w, shuffle=True, generator=g)
        return {"prepared": mine, "plain": [[b.tolist() for b in plain] for _ in range(2)]}

    run(results, "generator_parity", generator_parity)

    def generator_synced() -> Any:
        g = torch.Generator()
        prepared = prepare_data_loader(DataLoader(list(range(16)), batch_size=2, shuffle=True, generator=g))
        g.manual_seed(100 + r)  # ranks disagree: rank 0's state wins at the epoch start
        return [b.tolist() for b in prepared]

    run(results, "generator_synced", generator_synced)

    big = {"tensor": torch.zeros(1, 5) if r == 0 else torch.zeros(1, 2, 5)}
    run(results, "reduce_debug", lambda: list(c.reduce(big, debug=True)["tensor"].shape))
    run(results, "broadcast_debug", lambda: list(c.broadcast(big, debug=True)["tensor"].shape))
    run(results, "broadcast_objects_debug", lambda: c.broadcast_object_list([1] * (r + 1), debug=True))
    set_debug_mode(True)
    run(results, "pad_debug", lambda: list(c.pad_across_processes(big)["tensor"].shape))
    run(results, "reduce_debug_mode", lambda: list(c.reduce(big)["tensor"].shape))
    run(results, "reduce_debug_ok", lambda: c.reduce(torch.ones(2)).tolist())
    set_debug_mode(None)
    run(results, "gather_mismatch", lambda: c.gather(torch.zeros(2, r + 2)).tolist())
    run(results, "copy_tensor", lambda: c.copy_tensor_to_devices(torch.tensor([1, 2, 3]) if r == 0 else None).tolist())

    def rng() -> Any:
        torch.manual_seed(r)
        g = torch.Generator().manual_seed(10 + r)
        synchronize_rng_states(["torch", "generator"], generator=g)
        return [torch.rand(2).tolist(), torch.rand(2, generator=g).tolist()]

    run(results, "sync_rng", rng)
    report(results, sys.argv[1])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
