"""One rank of bench_scale.py: when each start-up stage ended, what x's start-up cost, all-reduce times.

    x-launch ... scale_step.py RESULTS_DIR [--iterations 30]

Writes RESULTS_DIR/rank<r>.json with wall-clock timestamps (time.time(); every namespace host
shares this machine's clock): when x-launch, torchrun's agent and this process were created
(from /proc), when torch and x_runtime were imported, when ``Accelerator()`` returned (the
process group is up), when the model and optimizer were built, when ``prepare()`` returned and when the first training step began. Also:
how many collectives (and process-group calls) the runtime made in ``Accelerator()`` and in
``prepare()``, counted by wrapping torch.distributed's functions before x_runtime is imported;
the CPU seconds x-launch and the agent had used by the first step; and the median of
``--iterations`` all-reduces of a 4-byte and a 1 MiB float32 tensor, each timed alone after a
barrier.
"""

from __future__ import annotations

import os
import time


def _created(pid: int | str) -> float:
    """When process ``pid`` was created, as time.time() (to the 10 ms of /proc's clock ticks)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    with open("/proc/uptime") as uptime:
        now_up = float(uptime.read().split()[0])
    return time.time() - (now_up - int(fields[19]) / os.sysconf("SC_CLK_TCK"))


def _cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has used itself (not its children)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


STAMPS = {"worker_created": _created("self")}

import argparse  # noqa: E402 - the stamp above comes first, before any import costs time
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# What a rank's start-up may call that talks to the other ranks (DDP's parameter broadcast and
# shape check included); wrapped before x_runtime binds any of them.
COUNTED = (
    "init_process_group",
    "new_group",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "_broadcast_coalesced",
    "_verify_params_across_processes",
)
CALLS: Counter[str] = Counter()


def _counting(name: str, function):
    def counted(*args, **kwargs):
        CALLS[name] += 1
        return function(*args, **kwargs)

    return counted


for _name in COUNTED:
    if hasattr(dist, _name):
        setattr(dist, _name, _counting(_name, getattr(dist, _name)))

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from x_runtime import Accelerator  # noqa: E402

STAMPS["imported"] = time.time()


def _all_reduce_seconds(numel: int, iterations: int) -> float:
    tensor = torch.ones(numel)
    for _ in range(3):  # warm-up: gloo sets up its buffers for this size
        dist.all_reduce(tensor)
    times = []
    for _ in range(iterations):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()

    launched_by_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    me = os.getpid()
    agent = _parent(me) if launched_by_torchrun else None
    x_launch = _parent(agent) if agent is not None else _parent(me)
    STAMPS["x_launch_created"] = _created(x_launch)
    if agent is not None:
        STAMPS["agent_created"] = _created(agent)

    before = Counter(CALLS)
    accelerator = Accelerator()
    STAMPS["process_group_ready"] = time.time()
    at_start = CALLS - before

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(
        torch.randn(64 * accelerator.num_processes, 64), torch.randn(64 * accelerator.num_processes, 1)
    )
    STAMPS["model_built"] = time.time()  # a fresh process's first optimizer alone takes ~1 s (torch's imports)
    before = Counter(CALLS)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=16))
    STAMPS["prepared"] = time.time()
    in_prepare = CALLS - before

    cpu = {"x_launch": _cpu_seconds(x_launch)}
    for step, (x, y) in enumerate(loader):
        if step == 0:
            STAMPS["first_step"] = time.time()
            # Read now: by the first step x-launch and the agent have done their start-up work.
            cpu["x_launch"] = _cpu_seconds(x_launch)
            if agent is not None:
                cpu["agent"] = _cpu_seconds(agent)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 2:
            break

    reduce_s = {}
    if dist.is_initialized():  # one process alone joins no group: nothing to reduce with
        reduce_s = {str(numel * 4): _all_reduce_seconds(numel, args.iterations) for numel in (1, 256 * 1024)}
    STAMPS["done"] = time.time()
    result = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "stamps": STAMPS,
        "collectives": {"Accelerator()": dict(at_start), "prepare()": dict(in_prepare)},
        "cpu_seconds": cpu,
        "all_reduce_s": reduce_s,
    }
    path = os.path.join(args.results, f"rank{accelerator.process_index}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)
    accelerator.end_training()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
