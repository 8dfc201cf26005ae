"""Each rank's stderr reaches the terminal whole, prefixed with its rank, from the files x-launch keeps."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from x_launch.run.rank_output import POLL_S, RankOutput


def _wait_for(collected: list[bytes], text: bytes, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in b"".join(collected):
        assert time.monotonic() < deadline, f"{text!r} not copied within {timeout} s: {b''.join(collected)!r}"
        time.sleep(POLL_S / 5)


def test_follows_files_as_they_appear_and_grow_and_writes_whole_lines(tmp_path: Path) -> None:
    collected: list[bytes] = []
    output = RankOutput(tmp_path, collected.append, role="trainer").start()
    first = tmp_path / "run_x" / "attempt_0" / "0" / "stderr.log"
    first.parent.mkdir(parents=True)
    with open(first, "ab") as handle:
        handle.write(b"one\ntw")
        handle.flush()
        _wait_for(collected, b"[trainer0]:one\n")
        time.sleep(3 * POLL_S)
        assert b"tw" not in b"".join(collected)  # half a line waits for the rest
        handle.write(b"o\n")
        handle.flush()
        _wait_for(collected, b"[trainer0]:two\n")
    # A rank of a later attempt (restarts) is found too; its unfinished last line ends at stop().
    later = tmp_path / "run_x" / "attempt_1" / "1" / "stderr.log"
    later.parent.mkdir(parents=True)
    later.write_bytes(b"again\nno newline")
    output.stop()
    output.stop()  # once is enough; a second stop changes nothing
    assert b"".join(collected) == b"[trainer0]:one\n[trainer0]:two\n[trainer1]:again\n[trainer1]:no newline\n"


def test_stop_copies_what_the_files_hold_without_waiting_for_a_poll(tmp_path: Path) -> None:
    path = tmp_path / "run" / "attempt_0" / "3" / "stderr.log"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 100_000 + b"\nlast\n")
    collected: list[bytes] = []
    output = RankOutput(tmp_path, collected.append).start()
    started = time.perf_counter()
    output.stop()
    assert time.perf_counter() - started < 1.0
    assert b"".join(collected) == b"[default3]:" + b"x" * 100_000 + b"\n[default3]:last\n"


SCRIPT = """
import os, sys, time
rank = os.environ["RANK"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
sys.stderr.write(f"rank {rank} attempt {attempt} begins ")
sys.stderr.flush()
time.sleep(0.3)
print(f"and ends", file=sys.stderr, flush=True)
print(f"rank {rank} stdout", flush=True)
if attempt == "0" and rank == "1":
    sys.exit(3)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun's per-rank log files")
def test_launch_shows_every_ranks_stderr_lines_whole_across_restarts_and_removes_the_files(
    console_script, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(TMPDIR=str(scratch), OMP_NUM_THREADS="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    done = subprocess.run(
        [console_script("x-launch"), "--num_processes", "2", "--cpu", "--max_restarts", "1", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    for attempt in (0, 1):
        for rank in (0, 1):
            assert f"[default{rank}]:rank {rank} attempt {attempt} begins and ends" in lines, done.stderr
    assert "rank 0 stdout" in done.stdout and "rank 1 stdout" in done.stdout  # stdout is not redirected
    assert list(scratch.iterdir()) == []
