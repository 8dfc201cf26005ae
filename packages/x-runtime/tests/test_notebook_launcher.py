"""``notebook_launcher``: a function in N forked processes on torch's elastic agent, as in Accelerate.

Real processes throughout. Beyond Accelerate's behaviour, two faults it has are checked gone: a
worker blocked in C++ when the agent stops the group dies at once (torch's agent otherwise waits
30 s per restart for a SIGTERM the worker cannot handle), and a rank joining a group that a peer
returned without joining fails in one line instead of waiting out the group timeout. One
process honours ``max_restarts`` as several do, which Accelerate's own ``test_fault_tolerant``
needs on one process to pass whatever the timing of its queue.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from x_runtime import PartialState, notebook_launcher, patch_environment


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _where(out: str) -> None:
    state = PartialState()
    with open(os.path.join(out, f"rank{state.process_index}"), "w") as f:
        f.write(f"{state.num_processes} {os.environ['X_MIXED_PRECISION']} {state.distributed_type}")


def _even_ranks_fail(sleep: float) -> None:
    if PartialState().process_index % 2 == 0:
        raise RuntimeError("even ranks fail")
    time.sleep(sleep)


def _fail_until_restarted(out: str) -> None:
    marker = os.path.join(out, f"tried{os.environ['RANK']}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    _where(out)


def test_notebook_launcher_one_process_runs_here() -> None:
    assert notebook_launcher(lambda a: a + 1, (1,), num_processes=1) == 2
    with pytest.raises(ValueError, match="num_processes"):
        notebook_launcher(print)
    with pytest.raises(ValueError, match="mixed_precision"):
        notebook_launcher(print, num_processes=1, mixed_precision="fp64")


def test_one_process_runs_the_function_again_up_to_max_restarts() -> None:
    calls: list[int] = []

    def fails_twice() -> str:
        calls.append(len(calls))
        if len(calls) <= 2:
            raise RuntimeError(f"attempt {len(calls)} fails")
        return "done"

    assert notebook_launcher(fails_twice, num_processes=1, max_restarts=3) == "done"
    assert calls == [0, 1, 2]
    calls.clear()
    # Restarts spent: the last attempt's own error, as with none at all.
    with pytest.raises(RuntimeError, match="attempt 2 fails"):
        notebook_launcher(fails_twice, num_processes=1, max_restarts=1)
    assert calls == [0, 1]
    calls.clear()
    with pytest.raises(RuntimeError, match="attempt 1 fails"):
        notebook_launcher(fails_twice, num_processes=1)
    assert calls == [0]


def _tough_nut(queue, tries: list[int]) -> None:
    # Accelerate 1.15's test_fault_tolerant function, counting its attempts.
    tries.append(1)
    if queue.empty():
        return
    trial = queue.get()
    if trial > 0:
        queue.put(trial - 1)
        raise RuntimeError("The nut hasn't cracked yet! Try again.")


def test_accelerates_fault_tolerant_test_passes_on_one_process_once_its_queue_is_flushed() -> None:
    queue = mp.get_context("fork").Queue()
    queue.put(3)
    # A put reaches the pipe when the queue's feeder thread runs; under CPU load it runs before
    # the function looks, which a short wait makes certain. One attempt then always failed.
    deadline = time.monotonic() + 10
    while queue.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not queue.empty()
    tries: list[int] = []
    notebook_launcher(_tough_nut, (queue, tries), num_processes=1, max_restarts=3)
    assert 2 <= len(tries) <= 4


def test_notebook_launcher_runs_two_processes(tmp_path) -> None:
    notebook_launcher(_where, (str(tmp_path),), num_processes=2, mixed_precision="bf16", use_port=_free_port())
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["2 bf16 MULTI_CPU"] * 2


def test_notebook_launcher_stops_every_rank_when_one_fails() -> None:
    start = time.monotonic()
    with pytest.raises(ChildFailedError, match="even ranks fail"):
        notebook_launcher(_even_ranks_fail, (60,), num_processes=2, monitor_interval=0.01, use_port=_free_port())
    assert time.monotonic() - start < 50


def test_notebook_launcher_restarts_failed_workers(tmp_path) -> None:
    notebook_launcher(_fail_until_restarted, (str(tmp_path),), num_processes=2, max_restarts=1, use_port=_free_port())
    assert (tmp_path / "rank0").exists() and (tmp_path / "rank1").exists()


def _rank1_returns_rank0_joins() -> None:
    if os.environ["RANK"] == "1":
        return
    PartialState()


def test_a_rank_joining_a_group_its_peer_left_fails_in_one_line() -> None:
    start = time.monotonic()
    # Were the peer check missing, the rendezvous would fail only after this group timeout.
    with (
        patch_environment(X_PROCESS_GROUP_TIMEOUT="60"),
        pytest.raises(ChildFailedError, match="rank 1 returned from the launched function without joining"),
    ):
        notebook_launcher(_rank1_returns_rank0_joins, num_processes=2, use_port=_free_port())
    assert time.monotonic() - start < 30


def _rank0_fails_rank1_blocks_in_cpp() -> None:
    if os.environ["RANK"] == "0":
        time.sleep(0.5)
        raise RuntimeError("rank 0 fails")
    # torch's own join, without x's peer check: gloo waits for rank 0 inside C++, where a Python
    # SIGTERM handler never runs.
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))


def test_a_worker_blocked_in_cpp_is_stopped_at_once_when_a_peer_fails() -> None:
    # The caller's own Python SIGTERM handler (a preemption hook, say) must not reach the workers.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    start = time.monotonic()
    try:
        with pytest.raises(ChildFailedError, match="rank 0 fails"):
            notebook_launcher(_rank0_fails_rank1_blocks_in_cpp, num_processes=2, use_port=_free_port())
    finally:
        signal.signal(signal.SIGTERM, previous)
    # torch's agent waits 30 s for a worker that ignores SIGTERM before it sends SIGKILL.
    assert time.monotonic() - start < 20


def _noop() -> None:
    return None


def test_the_callers_signal_handlers_come_back_after_a_launch() -> None:
    def mine(signum, frame) -> None:
        return None

    before_int = signal.getsignal(signal.SIGINT)
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        notebook_launcher(_noop, num_processes=2, use_port=_free_port())
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is before_int
    finally:
        signal.signal(signal.SIGTERM, previous)
