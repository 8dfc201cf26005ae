"""Every example runs, with short settings, so the docs that show them cannot lie.

examples/train.py runs under x-launch in test_launch_runtime.py; the others run here as a user
would run them, each checking its own result (big_inference.py exits non-zero if the offloaded
model's tokens differ from the in-memory model's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
COVERED_ELSEWHERE = {"train.py"}
SHORT = {
    "hardware_report.py": ["--layers", "2"],
    "big_inference.py": ["--layers", "4", "--budget", "40MiB"],
}


def test_every_example_has_a_short_run_here() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(SHORT) | COVERED_ELSEWHERE


@pytest.mark.parametrize("name", sorted(SHORT))
def test_example_runs(name: str, tmp_path: Path) -> None:
    argv = [sys.executable, str(EXAMPLES / name), *SHORT[name]]
    if name == "big_inference.py":
        argv += ["--folder", str(tmp_path / "run")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    if name == "big_inference.py":
        assert "disk" in done.stdout and done.stdout.rstrip().endswith("same tokens")
        assert "weight files written to the offload folder: 0" in done.stdout
    else:
        assert "Devices:" in done.stdout
