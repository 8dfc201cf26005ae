"""One real training step of a transformers model, measured: FSDP2 over gloo, or one plain process.

    python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp_step.py OUT CONFIG SEQ BATCH
    python fsdp_step.py OUT CONFIG SEQ BATCH          (no torchrun: one process, no sharding)

Under torchrun each decoder block is wrapped with ``fully_shard`` and then the root (the usual
FSDP2 recipe; the root unit holds everything outside the blocks). The step is the usual loop,
``outputs = model(**batch); loss = outputs.loss; loss.backward(); opt.step(); opt.zero_grad()``,
fp32, AdamW with ``foreach=False`` (what CPU tensors get by default). A first step creates the
optimizer state; the second is measured, as test_simulate_accuracy.py measures a real step:
torch.profiler's allocation events give the live-bytes curve of everything the step allocates,
and what exists before it (sharded parameters, buffers, optimizer state, batch) is counted from
its storages. A third step runs under torch's FSDPMemTracker for a breakdown by kind (sharded and
unsharded parameters, all-gather and reduce-scatter buffers, activations, ...) at the peak.

Each rank writes ``OUT/rank<RANK>.json``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch

OUT, CONFIG, S, B = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
DISTRIBUTED = "RANK" in os.environ
RANK = int(os.environ.get("RANK", "0"))


def storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 parameter is a DTensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def profiled_peak(step) -> tuple[int, int]:
    """(peak, end) of the bytes ``step()`` allocates, from torch.profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak, live


def main() -> dict:
    import transformers

    torch.set_num_threads(1)
    config = transformers.AutoConfig.from_pretrained(CONFIG)
    torch.manual_seed(0)
    model = getattr(transformers, config.architectures[0])(config)
    if DISTRIBUTED:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    g = torch.Generator().manual_seed(RANK)
    batch = {
        "input_ids": torch.randint(0, config.vocab_size, (B, S), generator=g),
        "labels": torch.randint(0, config.vocab_size, (B, S), generator=g),
    }

    def step() -> None:
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        del outputs, loss

    step()  # the optimizer state now exists: the step measured is any later step
    gc.collect()
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    weights = storage_bytes([*model.parameters(), *model.buffers()])
    before = storage_bytes([*model.parameters(), *model.buffers(), *state, *batch.values()])
    if DISTRIBUTED:
        dist.barrier()
    peak, end = profiled_peak(step)
    result = {
        "rank": RANK,
        "peak": before + peak,
        "before": before,
        "weights": weights,
        "optimizer_state": storage_bytes(state),
        "step_peak": peak,
        "step_end": end,
    }
    if DISTRIBUTED:
        try:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        except ImportError:
            FSDPMemTracker = None
        if FSDPMemTracker is not None:
            tracker = FSDPMemTracker(model, opt)
            tracker.track_inputs((batch["input_ids"], batch["labels"]))
            with tracker:
                step()
            (snapshot,) = tracker.get_tracker_snapshot("peak").values()
            result["tracker_peak"] = dict(snapshot)
            tracker = None
    model = opt = None
    gc.collect()
    return result


if __name__ == "__main__":
    report = main()
    Path(OUT, f"rank{RANK}.json").write_text(json.dumps(report))
    if DISTRIBUTED:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo may abort in interpreter teardown (see /work/shared/probes/README.md): the report is
    # written and the group destroyed, so leave without the teardown.
    os._exit(0)
