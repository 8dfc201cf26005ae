"""The pause at exit that lets gloo's worker threads drop their last collective (process/topology/exit_settle.py).

Why it exists: a rank that ends right after a collective could die with SIGABRT in interpreter
finalization (``terminate called without an active exception``), a CI failure seen under torchrun
and x-launch alike. The race itself hits a few runs in a hundred, too seldom for a test to catch a
regression; these tests pin each part of the remedy instead: the thread check sees what torch runs,
the pause is registered once whenever x joins or adopts a group, and it runs only while gloo's
threads are alive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from x_runtime.process.topology import exit_settle, join_group

# One fresh interpreter: the threads of a process this test suite already used say nothing.
_THREADS_SCRIPT = """
import datetime, json, torch, torch.distributed as dist
from x_runtime.process.topology.exit_settle import gloo_workers_alive
seen = {"before": gloo_workers_alive()}
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
out = [torch.zeros(1)]
dist.all_gather(out, torch.ones(1))
seen["in_group"] = gloo_workers_alive()
dist.destroy_process_group()
import gc; gc.collect()
seen["after_destroy"] = gloo_workers_alive()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
wrapped = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
del wrapped; gc.collect()
dist.destroy_process_group(); gc.collect()
seen["after_destroy_with_ddp"] = gloo_workers_alive()
print(json.dumps(seen))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (elsewhere the pause always runs)")
def test_the_thread_check_sees_what_torch_runs() -> None:
    done = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] is False and seen["in_group"] is True
    assert seen["after_destroy"] is False  # a group left cleanly takes its threads with it
    # The case the pause is for: a DDP wrapper built on the group keeps its threads past the destroy.
    assert seen["after_destroy_with_ddp"] is True


def test_the_pause_is_registered_once_when_a_group_is_joined_or_adopted(monkeypatch) -> None:
    registered: list = []
    monkeypatch.setattr(exit_settle.atexit, "register", registered.append)
    monkeypatch.setattr(exit_settle, "_registered", False)
    created = not dist.is_initialized()
    try:
        join_group(backend="gloo", timeout=timedelta(seconds=60), in_process=True)
        join_group(backend="gloo", timeout=timedelta(seconds=60), in_process=True)
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
    assert registered == [exit_settle._settle]


@pytest.mark.parametrize("alive", [True, False])
def test_the_pause_runs_only_while_gloo_threads_are_alive(monkeypatch, alive: bool) -> None:
    slept: list[float] = []
    monkeypatch.setattr(exit_settle, "gloo_workers_alive", lambda: alive)
    monkeypatch.setattr(exit_settle.time, "sleep", slept.append)
    exit_settle._settle()
    assert slept == ([exit_settle.SETTLE_SECONDS] if alive else [])
