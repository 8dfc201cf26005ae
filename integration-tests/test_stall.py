"""x-launch's stall watchdog and straggler report on real jobs: x-launch, torchrun, x_runtime, gloo.

Each job is ``workers/stall_worker.py`` (copied as ``train.py`` into its own folder, which is
also the working folder, so the summary says ``train.py:54``) on 2 or 3 CPU processes, stuck in
one way: a rank that sleeps, a rank that skips a collective (the last step's all-reduce, then
waits in a barrier), a rank whose DataLoader worker hangs, a rank blocked in a gloo receive inside
C++. Every job starts at once (a
module fixture), so the whole file takes about as long as its slowest job. The summary must name
the stuck rank and the line it is on, and the waiting ranks with their collective and line, within
the timeout plus 10 s of the stall (the "for N s" the summary prints); x-launch then exits with
124. A job whose steps last longer than the timeout but that keeps entering backward is not
stalled; a job with one slow rank names it at the end, unless ``--straggler_report false`` or
more processes than cores (said once, at the start); ``--stall-action report`` keeps the job.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and real-time signals")

WORKER = Path(__file__).resolve().parent / "workers" / "stall_worker.py"
TIMEOUT = 3  # --stall-timeout of the stuck jobs
STALL_EXIT = 124
JOB_LIMIT = 150  # seconds any job may take, every job running at once on a busy machine


def _line(text: str) -> int:
    """The worker's line holding ``text`` (so the tests do not hard-code line numbers)."""
    for number, line in enumerate(WORKER.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} is not in {WORKER}")


@dataclass
class Job:
    code: int
    stderr: str
    root: Path

    def summary(self) -> list[str]:
        """x-launch's lines but the one saying, at the start, that the CPU processes outnumber the cores."""
        lines = self.stderr.splitlines()
        return [line for line in lines if line.startswith("x-launch: ") and not CROWDED.match(line)]


LOGS = ("--log_dir", "logs")  # the stacks go there, inside the test's folder
CROWDED = re.compile(r"x-launch: (\d+) CPU processes on (\d+) logical cores? take turns on them: ")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

JOBS = {
    # name: (processes, x-launch flags, worker flags)
    "sleep": (3, ("--stall-timeout", str(TIMEOUT), *LOGS), ("--mode", "sleep")),
    "skip": (2, ("--stall-timeout", str(TIMEOUT), *LOGS), ("--mode", "skip")),
    "loader": (2, ("--stall-timeout", str(TIMEOUT), *LOGS), ("--mode", "loader")),
    "recv": (2, ("--stall-timeout", str(TIMEOUT), *LOGS), ("--mode", "recv")),
    # steps of 3 micro-batches, 1.5 s each: 4.5 s per step against a 3 s timeout
    "slow": (
        2,
        ("--stall-timeout", str(TIMEOUT), "--straggler_report", "false"),
        ("--mode", "slow", "--pace", "4.5", "--steps", "6"),
    ),
    "straggler": (2, (), ("--mode", "straggler", "--pace", "0.05", "--steps", "10")),
    "crowded": (3, (), ("--mode", "straggler", "--pace", "0.05", "--steps", "10")),
    "report": (
        2,
        ("--stall-timeout", str(TIMEOUT), "--stall-action", "report", *LOGS),
        ("--mode", "sleep", "--hang", str(TIMEOUT + 4)),
    ),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, launch_env) -> dict[str, Job]:
    """Every job of ``JOBS``, started together, once each has ended."""
    launcher = str(Path(sys.executable).with_name("x-launch"))
    running = {}
    for name, (processes, flags, worker_flags) in JOBS.items():
        root = tmp_path_factory.mktemp(name)
        shutil.copy(WORKER, root / "train.py")
        argv = [launcher, "--cpu", "--num_processes", str(processes), "--main_process_port", "0", *flags]
        err = open(root / "stderr", "w")  # noqa: SIM115 - closed below
        job = subprocess.Popen(
            [*argv, "train.py", *worker_flags], cwd=root, env=launch_env(root), stdout=subprocess.DEVNULL, stderr=err
        )
        running[name] = (job, root, err)
    done = {}
    for name, (job, root, err) in running.items():
        try:
            code = job.wait(timeout=JOB_LIMIT)
        except subprocess.TimeoutExpired:
            job.kill()
            code = job.wait()
        err.close()
        done[name] = Job(code, (root / "stderr").read_text(), root)
    return done


def _waited(line: str) -> int:
    found = re.search(r"for (\d+) s\)$", line)
    assert found is not None, line
    return int(found.group(1))


def _stalled(job: Job) -> list[str]:
    """The summary lines after the stall line, checked for the exit code and the head line."""
    assert job.code == STALL_EXIT, job.stderr[-3000:]
    lines = job.summary()
    head = f"x-launch: stalled: no rank made progress for {TIMEOUT} s (--stall-timeout {TIMEOUT})"
    assert head in lines, job.stderr[-3000:]
    assert lines[-1] == f"x-launch: stopping the job (exit code {STALL_EXIT}); --stall-action report keeps it running"
    return lines[lines.index(head) + 1 :]


BACKWARD = f"train.py:{_line('accelerator.backward(loss)')} in main: accelerator.backward(loss)"


def _starting(lines: list[str], prefix: str) -> str:
    found = [line for line in lines if line.startswith(prefix)]
    assert len(found) == 1, (prefix, lines)
    return found[0]


def test_a_sleeping_rank_is_named_with_its_line_and_the_others_wait_in_backward(jobs) -> None:
    job = jobs["sleep"]
    lines = _stalled(job)
    sleep = _line("time.sleep(args.hang)")
    assert lines[0] == "x-launch: rank 1 did not make call 7 (backward after 3 steps), which ranks 0, 2 made", lines
    assert lines[1].startswith(
        f"x-launch: rank 1 is not in a collective: at train.py:{sleep} in main: time.sleep(args.hang) (after 3 steps;"
    ), lines
    waiting = lines[2]
    assert waiting.startswith(f"x-launch: ranks 0, 2 wait in all_reduce (backward) at {BACKWARD} (after 3 steps, for ")
    assert _waited(waiting) <= TIMEOUT + 10
    # every rank's stacks and the summary, in --log_dir
    shown = _starting(lines, "x-launch: every rank's Python stack (all threads): ")
    folder = Path(shown.rsplit(": ", 1)[1])
    assert folder.parent == job.root / "logs" and folder.name.startswith("stall-")
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.txt", "rank-1.txt", "rank-2.txt", "summary.txt"]
    assert f'File "{job.root / "train.py"}", line {sleep} in main' in (folder / "rank-1.txt").read_text()
    assert (folder / "summary.txt").read_text().splitlines() == job.summary()[-len(lines) - 1 :]


def test_a_rank_that_skipped_a_collective_is_named(jobs) -> None:
    lines = _stalled(jobs["skip"])
    assert lines[0] == (
        "x-launch: the ranks went out of step at call 16: rank 0 made accelerator.reduce after 8 steps, "
        "rank 1 made accelerator.wait_for_everyone after 8 steps"
    ), lines
    reduce = _starting(lines, "x-launch: rank 0 waits")
    assert reduce.startswith(
        f"x-launch: rank 0 waits in all_reduce (accelerator.reduce) at train.py:{_line('accelerator.reduce(')} in main: "
        'accelerator.reduce(loss.detach(), reduction="mean") (after 8 steps, for '
    )
    barrier = _starting(lines, "x-launch: rank 1 waits")
    assert barrier.startswith(
        "x-launch: rank 1 waits in barrier (accelerator.wait_for_everyone) at "
        f"train.py:{_line('accelerator.wait_for_everyone()')} in main: accelerator.wait_for_everyone() (after 8 steps, "
    )
    assert _waited(reduce) <= TIMEOUT + 10 and _waited(barrier) <= TIMEOUT + 10


def test_a_rank_waiting_for_its_dataloader_worker_shows_the_workers_line(jobs) -> None:
    lines = _stalled(jobs["loader"])
    loop = _line("enumerate(loader)")
    mine = _starting(lines, "x-launch: rank 1 is waiting for a batch from its DataLoader: ")
    assert mine.startswith(
        f"x-launch: rank 1 is waiting for a batch from its DataLoader: at train.py:{loop} in main: "
        "for step, (x, y) in enumerate(loader): (after 3 steps;"
    ), lines
    worker = lines[lines.index(mine) + 1]
    assert re.fullmatch(
        rf"x-launch:   its DataLoader worker \(pid \d+\) is at train.py:{_line('the stuck sample')} in __getitem__: "
        r"time.sleep\(600\)",
        worker,
    ), lines
    waiting = _starting(lines, "x-launch: rank 0 waits")
    assert waiting.startswith(f"x-launch: rank 0 waits in all_reduce (backward) at {BACKWARD} (after 3 steps, for ")
    assert _waited(waiting) <= TIMEOUT + 10


def test_a_rank_blocked_in_a_gloo_receive_is_named_by_its_torch_distributed_call(jobs) -> None:
    lines = _stalled(jobs["recv"])
    recv = _line("dist.recv(")
    waiting = _starting(lines, "x-launch: rank 0 waits")
    assert waiting.startswith(f"x-launch: rank 0 waits in all_reduce (backward) at {BACKWARD} (after 3 steps, for ")
    mine = _starting(lines, "x-launch: rank 1 waits")
    assert mine.startswith(
        f"x-launch: rank 1 waits in recv (torch.distributed) at train.py:{recv} in main: "
        "dist.recv(torch.zeros(1), src=0) (after 3 steps, for "
    ), lines
    assert _waited(mine) <= TIMEOUT + 10


def test_steps_longer_than_the_timeout_are_progress_when_backward_runs_inside_them(jobs) -> None:
    job = jobs["slow"]
    assert job.code == 0, job.stderr[-3000:]
    assert "stalled" not in job.stderr
    assert not any("step time" in line for line in job.summary()), job.summary()  # --straggler_report false


def test_more_processes_than_cores_is_said_once_and_names_no_straggler(jobs) -> None:
    job = jobs["crowded"]  # 3 processes: more than CI's 2 cores
    assert job.code == 0, job.stderr[-3000:]
    said = [line for line in job.stderr.splitlines() if CROWDED.match(line)]
    timed = [line for line in job.summary() if "step time" in line]
    if CORES >= 3:  # they do not take turns: no word of it, and the report as usual
        assert (said, len(timed)) == ([], 1), job.stderr[-3000:]
        return
    assert said == [
        f"x-launch: 3 CPU processes on {CORES} logical core{'s' if CORES > 1 else ''} take turns on them: the job "
        "runs slower than with fewer, and its step times say little (no straggler report at the end)"
    ]
    assert timed == [], job.summary()


def test_the_end_of_a_job_names_the_straggler(jobs) -> None:
    job = jobs["straggler"]
    assert job.code == 0, job.stderr[-3000:]
    lines = job.summary()
    head = "x-launch: step time over the last 9 steps, median / p95 (outside backward and collectives in brackets):"
    assert head in lines, job.stderr[-3000:]
    rows = lines[lines.index(head) + 1 :]
    assert re.fullmatch(r"x-launch:   rank 0: [\d.]+ / [\d.]+ ms \([\d.]+ / [\d.]+ ms\)", rows[0]), rows
    assert re.fullmatch(r"x-launch:   rank 1: [\d.]+ / [\d.]+ ms \([\d.]+ / [\d.]+ ms\)  <- straggler", rows[1]), rows
    assert re.fullmatch(
        r"x-launch: straggler: rank 1 spends [\d.]+ ms per step outside backward and collectives, "
        r"the median rank [\d.]+ ms \(margin 20%\)",
        rows[2],
    ), rows


def test_report_only_keeps_the_job_running(jobs) -> None:
    job = jobs["report"]
    assert job.code == 0, job.stderr[-3000:]
    lines = job.summary()
    assert lines.count(f"x-launch: stalled: no rank made progress for {TIMEOUT} s (--stall-timeout {TIMEOUT})") == 1
    assert any(line.startswith("x-launch: rank 1 is not in a collective: at train.py:") for line in lines), lines
    assert not any("stopping the job" in line for line in lines)
