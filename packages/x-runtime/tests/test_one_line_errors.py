"""A missing checkpoint folder ends the script in one line, not a traceback through x's internals.

Real scripts in real interpreters: the hook acts at interpreter exit, where pytest cannot stand in.
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
elif sys.argv[1] == "raise":
    raise ValueError("the script's own bug")
else:
    accelerator.load_state(sys.argv[1])
"""


def run(folder: Path, *args: str, prelude: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "ACCELERATE_"))} | env
    return subprocess.run(
        [sys.executable, "-c", prelude + SCRIPT, *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("one-line")
    assert run(where, "save").returncode == 0
    return where


def test_a_missing_checkpoint_is_one_line_naming_what_is_there(folder: Path) -> None:
    done = run(folder, "checkpoints/step_100")
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["error: no checkpoint at checkpoints/step_100 (checkpoints holds step_90)"]


def test_a_missing_parent_folder_says_so(folder: Path) -> None:
    done = run(folder, "checkpoint/step_90")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error: no checkpoint at checkpoint/step_90 (checkpoint does not exist either; pass the folder save_state wrote)"
    ]


def test_the_debug_setting_shows_the_traceback(folder: Path) -> None:
    done = run(folder, "checkpoints/step_100", X_DEBUG_MODE="1")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.rstrip().endswith(
        "CheckpointNotFoundError: no checkpoint at checkpoints/step_100 (checkpoints holds step_90)"
    )


def test_a_hook_the_script_set_is_kept(folder: Path) -> None:
    prelude = (
        "import sys\nsys.excepthook = lambda kind, value, tb: print('own hook:', kind.__name__, file=sys.stderr)\n"
    )
    done = run(folder, "checkpoints/step_100", prelude=prelude)
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["own hook: CheckpointNotFoundError"]


def test_other_errors_keep_their_traceback(folder: Path) -> None:
    done = run(folder, "raise")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.rstrip().endswith("ValueError: the script's own bug")
