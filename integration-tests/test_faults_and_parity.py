"""Real jobs under x-launch: world-size parity, a kill inside save_state, dying ranks and signals.

- One training run on 1, 2 and 3 processes ends with the same weights (``workers/train_parity.py``).
- SIGKILL while ``save_state`` writes a checkpoint leaves only complete checkpoints for
  ``load_state``; the resumed run ends bit for bit where an uninterrupted one does
  (``workers/train_checkpoints.py``); so does a run whose rank dies once mid-epoch and that
  ``x-launch --max_restarts 1`` restarts, resuming from the latest complete checkpoint.
- A rank killed inside an Accelerator training loop (its peer blocked in a gradient all-reduce,
  unlike the sleeping workers of ``packages/x-launch/tests/run/test_faults.py``), and SIGTERM to
  x-launch during such a loop, stop the whole job (``workers/train_forever.py``).

Process trees are read from /proc (Linux), so "nothing left" is checked, not assumed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from process_tree import descendants, process_table
from safetensors.torch import load_file

from x_runtime.checkpoint.checkpointing import MANIFEST, latest_checkpoint, resolve_checkpoint

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")

WORKERS = Path(__file__).resolve().parent / "workers"


def _x_launch(processes: int, worker: str, *args: str | Path) -> list[str]:
    launcher = str(Path(sys.executable).with_name("x-launch"))
    flags = ["--num_processes", str(processes), "--cpu", "--main_process_port", "0"]
    return [launcher, *flags, str(WORKERS / worker), *map(str, args)]


# --- the process table ------------------------------------------------------------------------
def _left_over(pids: set[int], sessions: set[int]) -> set[int]:
    """Live (not zombie) processes among ``pids`` or in one of ``sessions``."""
    return {
        pid
        for pid, (state, _parent, session) in process_table().items()
        if state != "Z" and (pid in pids or session in sessions)
    }


class Job:
    """x-launch in a session of its own (signals from the test reach it alone, as a user's kill)."""

    def __init__(self, argv: list[str], environ: dict[str, str], logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.out, self.err = logs / "stdout", logs / "stderr"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(argv, env=environ, stdout=out, stderr=err, start_new_session=True)
        self.seen: set[int] = set()  # every process of the job observed so far

    def snapshot(self) -> set[int]:
        self.seen |= descendants(self.proc.pid)
        return set(self.seen)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_for(self, *paths: Path, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not all(path.exists() for path in paths):
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended (exit {self.proc.returncode}) early:\n{self.stderr()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"not there after {timeout} s: {[str(p) for p in paths if not p.exists()]}")
            self.snapshot()
            time.sleep(0.05)
        self.snapshot()

    def kill_everything(self) -> None:
        if self.proc.poll() is None:
            self.snapshot()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in _left_over(self.seen, set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def start(tmp_path: Path, launch_env) -> Iterator:
    jobs: list[Job] = []

    def go(argv: list[str], name: str) -> Job:
        job = Job(argv, launch_env(tmp_path), tmp_path / "logs" / name)
        jobs.append(job)
        return job

    yield go
    for job in jobs:  # never leave a stray job behind a failing test
        job.kill_everything()


def _run(argv: list[str], environ: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


def _wait_gone(pids: set[int], sessions: set[int], within: float) -> set[int]:
    deadline = time.monotonic() + within
    while (left := _left_over(pids, sessions)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# --- 1. parity across world sizes -------------------------------------------------------------
def test_one_two_and_three_processes_end_with_the_same_weights(tmp_path: Path, launch_env) -> None:
    results = {}
    for processes in (1, 2, 3):
        out = tmp_path / f"weights-{processes}.safetensors"
        run = _run(_x_launch(processes, "train_parity.py", out), launch_env(tmp_path))
        seen = sorted(re.findall(r"rank (\d+): world size (\d+)", run.stdout))
        assert seen == [(str(rank), str(processes)) for rank in range(processes)], run.stdout
        assert "steps 40: loss" in run.stdout
        results[processes] = load_file(out)

    order = results[1]["order"]
    assert order.shape == (40, 48)
    epochs = order.reshape(4, 480)
    for epoch in epochs:  # every sample once per epoch, shuffled, differently each epoch
        assert torch.equal(epoch.sort().values, torch.arange(480))
    assert not torch.equal(epochs[0], torch.arange(480)) and not torch.equal(epochs[0], epochs[1])
    for processes in (2, 3):
        other = results[processes]
        assert other.keys() == results[1].keys()
        assert torch.equal(other["order"], order), f"{processes} processes saw another global order of samples"
        for name, tensor in results[1].items():
            if name.startswith("weights."):
                torch.testing.assert_close(other[name], tensor, rtol=1e-5, atol=1e-5, msg=f"{name}, {processes} procs")


# --- 2. SIGKILL inside save_state, then resume --------------------------------------------------
def test_a_kill_inside_save_state_leaves_the_previous_checkpoint_and_resumes_exactly(
    start, tmp_path: Path, launch_env
) -> None:
    worker = "train_checkpoints.py"
    # 2 processes x 8 batches of 8 per epoch, 3 epochs: 24 steps, checkpoint_<n> after step 5(n+1).
    reference = _run(
        _x_launch(2, worker, tmp_path / "reference", tmp_path / "reference.safetensors"), launch_env(tmp_path)
    )
    assert "trained 24 steps" in reference.stdout
    assert sorted(os.listdir(tmp_path / "reference" / "checkpoints")) == [f"checkpoint_{n}" for n in (1, 2, 3)]

    project, root = tmp_path / "interrupted", tmp_path / "interrupted" / "checkpoints"
    marker = tmp_path / "inside-save"
    argv = _x_launch(2, worker, project, tmp_path / "resumed.safetensors", "--stall-in-save", "2")
    job = start([*argv, "--stall-marker", str(marker)], "interrupted")
    job.wait_for(marker)
    # Stopped inside the save of checkpoint_2 (step 15, mid-epoch): weights and optimizer written.
    partial = root / ".checkpoint_2.partial"
    assert {"model.safetensors", "optimizer.bin"} <= set(os.listdir(partial))
    saver = int(marker.read_text())
    assert saver in job.snapshot()
    os.kill(saver, signal.SIGKILL)
    assert job.wait(timeout=60) != 0
    stderr = job.stderr()
    assert "x-launch: rank 0 (local rank 0 on" in stderr and "was killed by SIGKILL" in stderr, stderr[-3000:]

    # What load_state could pick up: the complete checkpoints only.
    assert sorted(os.listdir(root)) == [".checkpoint_2.partial", "checkpoint_0", "checkpoint_1"]
    assert all((root / f"checkpoint_{n}" / MANIFEST).is_file() for n in (0, 1))
    assert not (partial / MANIFEST).exists()
    assert latest_checkpoint(root) == root / "checkpoint_1"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_checkpoint(partial)

    resumed = _run(_x_launch(2, worker, project, tmp_path / "resumed.safetensors", "--resume"), launch_env(tmp_path))
    seen = sorted(re.findall(r"rank (\d+): resumed from (\S+) at step (\d+)", resumed.stdout))
    assert seen == [(str(rank), "checkpoint_1", "10") for rank in (0, 1)], resumed.stdout
    assert "trained 24 steps" in resumed.stdout
    # The next save of checkpoint_2 replaced the leftover; total_limit=3 pruned checkpoint_0.
    assert sorted(os.listdir(root)) == [f"checkpoint_{n}" for n in (1, 2, 3)]

    expected = load_file(tmp_path / "reference.safetensors")
    got = load_file(tmp_path / "resumed.safetensors")
    assert got.keys() == expected.keys()
    differ = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert not differ, f"the resumed run ended with other weights: {differ}"


def test_a_rank_that_dies_once_is_restarted_and_the_job_ends_with_the_uninterrupted_weights(
    tmp_path: Path, launch_env
) -> None:
    worker = "train_checkpoints.py"
    reference = _run(
        _x_launch(2, worker, tmp_path / "reference", tmp_path / "reference.safetensors"), launch_env(tmp_path)
    )
    assert "trained 24 steps" in reference.stdout
    marker = tmp_path / "died"
    argv = _x_launch(2, worker, tmp_path / "restarted", tmp_path / "restarted.safetensors", "--resume-if-any")
    # Rank 1 dies after step 13, between checkpoint_1 (step 10) and checkpoint_2 (step 15).
    argv = [argv[0], "--max_restarts", "1", *argv[1:], "--die-at-step", "13", "--die-marker", str(marker)]
    restarted = _run(argv, launch_env(tmp_path), timeout=300)
    assert marker.read_text() == "died once"
    assert "x-launch: local rank 1 exited with code 17; torchrun restarts every rank" in restarted.stderr
    seen = sorted(re.findall(r"rank (\d+): resumed from (\S+) at step (\d+)", restarted.stdout))
    assert seen == [(str(rank), "checkpoint_1", "10") for rank in (0, 1)], restarted.stdout
    assert "trained 24 steps" in restarted.stdout

    expected = load_file(tmp_path / "reference.safetensors")
    got = load_file(tmp_path / "restarted.safetensors")
    assert got.keys() == expected.keys()
    differ = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert not differ, f"the restarted run ended with other weights: {differ}"


# --- 3 and 4. a dying rank, a stopped launcher ----------------------------------------------------
def _training_job(start, tmp_path: Path, name: str) -> tuple[Job, dict[int, int]]:
    ready = tmp_path / name
    ready.mkdir()
    job = start(_x_launch(2, "train_forever.py", ready), name)
    job.wait_for(ready / "ready0", ready / "ready1")
    ranks = {rank: int((ready / f"ready{rank}").read_text()) for rank in (0, 1)}
    tree = job.snapshot()
    assert set(ranks.values()) <= tree and len(tree) >= 3, (ranks, tree)  # the agent and two ranks
    return job, ranks


def test_a_rank_killed_mid_training_stops_the_job_and_is_named(start, tmp_path: Path) -> None:
    job, ranks = _training_job(start, tmp_path, "kill-rank")
    tree = job.snapshot()
    os.kill(ranks[1], signal.SIGKILL)
    killed_at = time.monotonic()
    code = job.wait(timeout=60)
    took = time.monotonic() - killed_at
    stderr = job.stderr()
    assert code != 0
    assert took < 10, f"x-launch exited {took:.1f} s after the rank was killed"
    assert "x-launch: rank 1 (local rank 1 on" in stderr and "was killed by SIGKILL" in stderr, stderr[-3000:]
    # Each rank leads a session of its own under torchrun; the launcher leads the test's one.
    left = _wait_gone(tree, {job.proc.pid, *ranks.values()}, within=2)
    assert not left, f"processes of the job outlived it: {sorted(left)}"


def test_sigterm_to_x_launch_mid_training_stops_every_process(start, tmp_path: Path) -> None:
    job, ranks = _training_job(start, tmp_path, "sigterm")
    tree = job.snapshot()
    os.kill(job.proc.pid, signal.SIGTERM)
    left = _wait_gone(tree | {job.proc.pid}, {job.proc.pid, *ranks.values()}, within=5)
    assert not left, f"still running 5 s after SIGTERM: {sorted(left)}"
    assert job.wait(timeout=10) != 0
    # A stop the user asked for is not reported as a failing rank.
    assert "x-launch: rank" not in job.stderr()


def test_the_killed_rank_is_named_even_when_its_peer_exits_before_the_agent_looks(start, tmp_path: Path) -> None:
    job, ranks = _training_job(start, tmp_path, "busy-agent")
    agents = [pid for pid, (_state, parent, _session) in process_table().items() if parent == job.proc.pid]
    assert len(agents) == 1, agents
    # torchrun's agent looks every 0.1 s; on a busy node it may not get the CPU for longer than that.
    os.kill(agents[0], signal.SIGSTOP)
    try:
        os.kill(ranks[1], signal.SIGKILL)
        left = _wait_gone({ranks[0]}, set(), within=30)  # rank 0 fails its next all-reduce and exits
        if left:
            pytest.fail("rank 0 did not stop after its peer was killed")
    finally:
        os.kill(agents[0], signal.SIGCONT)
    assert job.wait(timeout=60) != 0
    stderr = job.stderr()
    assert "x-launch: rank 1 (local rank 1 on" in stderr and "was killed by SIGKILL" in stderr, stderr[-3000:]
