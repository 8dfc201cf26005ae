"""A script's mistake under x-launch is one line per job, not a traceback per rank.

The newcomer's stumble: ``load_state`` of a folder that is not there printed a 20-line traceback
per rank, and x-launch printed rank 0's tail again (about 75 lines on 2 processes). Real
processes: x-launch starts 2 CPU ranks (gloo) that each raise the agreed error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys, torch
from x_runtime import Accelerator
accelerator = Accelerator(cpu=True)
accelerator.prepare(torch.nn.Linear(2, 2))
if sys.argv[1] == "save":
    accelerator.save_state("checkpoints/step_90")
elif sys.argv[1] == "bug":  # a real error on rank 1 only, in the middle of a save
    import x_runtime.checkpoint.checkpointing as checkpointing
    if accelerator.process_index == 1:
        def broken(obj, path):
            raise OSError("injected: the network file system went away")
        checkpointing.torch_save = broken
    accelerator.save_state("checkpoints/step_100")
else:
    accelerator.load_state(sys.argv[1])
"""
LINE = "no checkpoint at checkpoints/step_100 (checkpoints holds step_90)"


def x_launch(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "ACCELERATE_"))}
    launcher = Path(sys.executable).with_name("x-launch")
    return subprocess.run([str(launcher), *args], cwd=folder, capture_output=True, text=True, env=environ, timeout=300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("one-line-launch")
    (where / "train.py").write_text(SCRIPT)
    saved = x_launch(where, "--cpu", "--num_processes", "1", "train.py", "save")
    assert saved.returncode == 0, saved.stderr
    return where


def test_a_missing_checkpoint_on_two_ranks_is_one_line_for_the_job(folder: Path) -> None:
    done = x_launch(folder, "--cpu", "--num_processes", "2", "train.py", "checkpoints/step_100")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output, output
    # Said once: by rank 0, naming the ranks; x-launch does not print it again.
    said = [line for line in output.splitlines() if LINE in line]
    assert len(said) == 1, output
    assert said[0].endswith(f"error: load_state failed on ranks 0, 1: CheckpointNotFoundError: {LINE}"), said
    assert "last lines of rank" not in output, output


def test_debug_keeps_every_traceback(folder: Path) -> None:
    done = x_launch(folder, "--cpu", "--num_processes", "2", "--debug", "train.py", "checkpoints/step_100")
    output = done.stdout + done.stderr
    assert done.returncode == 1
    assert output.count("CheckpointNotFoundError") >= 2 and "Traceback (most recent call last)" in output, output


def test_a_failure_on_one_rank_shows_one_traceback(folder: Path) -> None:
    done = x_launch(folder, "--cpu", "--num_processes", "2", "train.py", "bug")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    # Rank 1 failed: its traceback, once; rank 0 did its part and says so in one line.
    headers = [line for line in output.splitlines() if "Traceback (most recent call last)" in line]
    assert headers and all(line.startswith("[default1]:") for line in headers), output
    assert output.count("OSError: injected: the network file system went away") >= 1
    told = [line for line in output.splitlines() if line.startswith("[default0]:")]
    assert told == [
        "[default0]:[rank0]: error: save_state failed on rank 1: OSError: injected: the network file system went away"
    ], output
    assert "last lines of rank" not in output, output
