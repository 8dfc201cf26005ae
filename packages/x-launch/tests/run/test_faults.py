"""Faults: a dying rank stops the job and is named; signals to x-launch leave no process behind.

Process trees are read from /proc (Linux), so "nothing left" is checked, not assumed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from x_launch.run.failures import AgentError, RankFailure, describe_failure, read_report, root_cause, write_report

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")

WORKER = """
import os, signal, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
print(f"rank {rank} is working", flush=True)
print(f"rank {rank} last words", file=sys.stderr, flush=True)
Path(sys.argv[1], f"ready{rank}").write_text(str(os.getpid()))
mode = sys.argv[2]
if rank == 1 and mode == "kill":
    while len(list(Path(sys.argv[1]).glob("ready*"))) < 2:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 1 and mode == "exit":
    sys.exit(7)
time.sleep(120)
"""


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            alive.add(pid)
    return alive


@pytest.fixture
def start(console_script, tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    clean.update(XDG_CONFIG_HOME=str(tmp_path / "cfg"), HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    started: list[subprocess.Popen] = []

    def go(mode: str, *flags: str) -> subprocess.Popen:
        argv = [console_script("x-launch"), "--num_processes", "2", "--cpu", "--main_process_port", "0", *flags]
        proc = subprocess.Popen(
            [*argv, str(script), str(tmp_path), mode],
            env=clean,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # signals from the test reach x-launch only, as from a user's kill
        )
        started.append(proc)
        return proc

    yield go
    for proc in started:  # never leave a stray job behind a failing test
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_ready(folder: Path, count: int = 2, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("ready*"))) < count:
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.05)


def test_a_killed_rank_stops_the_job_and_is_named_with_its_log(start, tmp_path: Path) -> None:
    proc = start("kill", "--log_dir", str(tmp_path / "logs"))
    _wait_ready(tmp_path)
    killed_at = time.monotonic()
    tree = _children(proc.pid)
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - killed_at < 10, "the job did not stop within 10 s of the rank dying"
    assert proc.returncode != 0
    assert "x-launch: rank 1 (local rank 1 on" in stderr and "was killed by SIGKILL" in stderr
    assert "x-launch: last lines of rank 1's stderr (" in stderr and "  | rank 1 last words" in stderr
    time.sleep(0.5)
    assert _alive(tree) == set(), "processes of the job outlived it"


def test_a_rank_exit_code_is_named(start, tmp_path: Path) -> None:
    proc = start("exit")
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert "x-launch: rank 1 (local rank 1 on" in stderr and "exited with code 7" in stderr
    # Without --log_dir x-launch keeps each rank's stderr in a scratch folder, quotes it, removes it.
    assert "x-launch: last lines of rank 1's stderr:\n  | rank 1 last words" in stderr
    assert not list(Path(tempfile.gettempdir()).glob(f"x-launch-{proc.pid}-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_x_launch_leaves_no_process_behind(start, tmp_path: Path, sig) -> None:
    proc = start("wait")
    _wait_ready(tmp_path)
    tree = _children(proc.pid)
    workers = {int(p.read_text()) for p in tmp_path.glob("ready*")}
    assert workers <= tree and len(tree) >= 3  # the agent and two workers
    os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=30)
    deadline = time.monotonic() + (5 if sig != signal.SIGKILL else 10)
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(tree) == set(), f"left behind after {sig.name}: {sorted(_alive(tree))}"
    # A stop the user asked for is not reported as a failing rank, and exits as a shell reports it.
    assert "x-launch: rank" not in stderr
    assert proc.returncode == (128 + sig if sig != signal.SIGKILL else -signal.SIGKILL)


def _failed(*failures: tuple[int, int, int, int]) -> ChildFailedError:
    """torchrun's own exception for failures of ``(rank, local_rank, exit code, second)``, first listed first."""
    found = {}
    for rank, local_rank, code, second in failures:
        failure = ProcessFailure(local_rank=local_rank, pid=12890 + rank, exitcode=code, error_file="<N/A>")
        failure.timestamp = second
        found[rank] = failure
    return ChildFailedError("worker.py", found)


def test_the_root_cause_is_read_from_torchruns_child_failed_error() -> None:
    failed = _failed((5, 1, -9, 1764471096))
    assert root_cause(failed, host="node7") == RankFailure(rank=5, local_rank=1, exit_code=-9, host="node7")
    # What the agent wrote is what x-launch reads back, whole.
    report = Path(tempfile.mkdtemp()) / "failure.json"
    write_report(report, root_cause(failed, host="node7"))
    assert read_report(report) == RankFailure(rank=5, local_rank=1, exit_code=-9, host="node7")
    write_report(report, AgentError("RendezvousTimeoutError", "timed out"))
    assert str(read_report(report)) == "RendezvousTimeoutError: timed out"


def test_a_rank_killed_in_the_same_second_as_the_root_cause_is_named_instead() -> None:
    # Rank 1 was killed; rank 0 then failed on the broken connection within the same second, and
    # torchrun breaks the tie by the lowest rank. The signal is the cause.
    second = 1764471096
    assert _failed((0, 0, 1, second), (1, 1, -9, second)).get_first_failure()[0] == 0  # torchrun's choice
    assert root_cause(_failed((0, 0, 1, second), (1, 1, -9, second)), host="node7") == RankFailure(
        rank=1, local_rank=1, exit_code=-9, host="node7"
    )
    later = _failed((0, 0, 1, second), (1, 1, -9, second + 1))
    assert root_cause(later).rank == 0  # not the same second: torchrun's root cause stands
    stopped = _failed((0, 0, 1, second), (1, 1, -15, second))
    assert root_cause(stopped).rank == 0  # SIGTERM: torchrun stopping the others, not a cause
    # torchrun named the rank it stopped (lowest rank of the second); the one that exited is the cause.
    swapped = _failed((0, 0, -15, second), (1, 1, 7, second))
    assert root_cause(swapped, host="node7") == RankFailure(rank=1, local_rank=1, exit_code=7, host="node7")
    assert read_report(Path(tempfile.gettempdir()) / "no-such-report.json") is None


def test_describe_failure_tails_the_newest_attempts_log(tmp_path: Path) -> None:
    for attempt, text in ((0, "old\n"), (1, "".join(f"line {i}\n" for i in range(30)))):
        folder = tmp_path / "run" / f"attempt_{attempt}" / "1"
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
        (folder / "stdout.log").write_text("")
        time.sleep(0.01)
    lines = describe_failure(RankFailure(5, 1, 3, "node7"), tmp_path, 1)
    assert lines[1] == f"x-launch: last lines of rank 5's stderr ({folder / 'stderr.log'}):"
    assert (
        lines[0]
        == "x-launch: rank 5 (local rank 1 on node7) exited with code 3; the other ranks were stopped and the job exited 1"
    )
    assert lines[-1] == "  | line 29" and len(lines) == 2 + 15


@pytest.mark.parametrize("scratch", [True, False])
def test_a_one_line_error_streamed_to_the_terminal_is_not_said_again(tmp_path: Path, scratch: bool) -> None:
    folder = tmp_path / "run" / "attempt_0" / "0"
    folder.mkdir(parents=True)
    error = "[rank0]: error: load_state failed on ranks 0, 1: CheckpointNotFoundError: no checkpoint at ckpt\n"
    (folder / "stderr.log").write_text("a warning the script logged\n" + error + "\n")
    lines = describe_failure(RankFailure(0, 0, 1, None), tmp_path, 1, scratch=scratch)
    if scratch:  # the rank's lines were streamed as they came: the error is on the terminal already
        assert lines == [
            "x-launch: rank 0 (local rank 0) exited with code 1; the other ranks were stopped and the job exited 1"
        ]
    else:  # kept in --log_dir's files: the tail shows it
        assert lines[-2] == f"  | {error.rstrip()}"


def test_a_streamed_traceback_is_pointed_to_not_quoted_again(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "attempt_0" / "1"
    folder.mkdir(parents=True)
    (folder / "stderr.log").write_text(
        "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 3\n[rank1]: KeyError: 'x'\n"
    )
    streamed = describe_failure(RankFailure(1, 1, 1, None), tmp_path, 1, scratch=True)
    assert streamed[1:] == ["x-launch: rank 1's traceback is above"]
    kept = describe_failure(RankFailure(1, 1, 1, None), tmp_path, 1, scratch=False)  # --log_dir: quoted
    assert kept[-1] == "  | [rank1]: KeyError: 'x'"
