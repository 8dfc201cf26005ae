"""An allocation failure ends the script in one line: the batch, the peak, what to try, the log.

Real allocation failures (the CPU allocator refusing 32 TiB) in real interpreters, one process and
two under torchrun: the hook acts at interpreter exit, where pytest cannot stand in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
from x_runtime import Accelerator

class Greedy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 2)

    def forward(self, x):
        if x.shape[0] == 8:  # the allocation a too-large batch asks for
            torch.empty(2**45, dtype=torch.uint8)
        return self.linear(x)

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=int(sys.argv[1]))
data = TensorDataset(torch.randn(64, 16), torch.randint(0, 100, (64, 16)))
model, loader = accelerator.prepare(Greedy(), DataLoader(data, batch_size=8))
for features, tokens in loader:
    model(features)
"""


def run(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "ACCELERATE_"))} | env
    environ["TMPDIR"] = str(folder)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], cwd=folder, capture_output=True, text=True, env=environ, timeout=120
    )


LINE = re.compile(
    r"error: out of memory on rank (\d) \(cpu\) with batch \{0: 8x16 float32, 1: 8x16 int64\}: "
    r"peak [\d.]+ GiB resident of [\d.]+ GiB; try a batch of 4 with gradient_accumulation_steps=(\d+) "
    r"\(the same (\d+) examples per optimizer step\), activation checkpointing, or the settings "
    r"`x-estimate MODEL --plan` finds; traceback in (\S+)$"
)


def test_an_allocation_failure_is_one_line_with_the_batch_and_the_advice(tmp_path: Path) -> None:
    done = run(tmp_path, "2")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    found = LINE.match(lines[0])
    assert found, lines[0]
    assert found.groups()[:3] == ("0", "4", "16")  # accumulation doubled, the examples per step kept
    log = Path(found.group(4))
    assert log.parent == tmp_path / "x-oom" and log.is_file()
    text = log.read_text()
    assert text.startswith("Traceback") and "can't allocate memory" in text and "in forward" in text


def test_runs_one_after_another_each_say_their_line(tmp_path: Path) -> None:
    # Two scripts from one shell within a minute: each process is its own rank group (one process),
    # so neither keeps quiet for the other.
    for _ in range(2):
        done = run(tmp_path, "2")
        assert done.returncode == 1 and LINE.match(done.stderr.strip()), done.stderr
    assert not list((tmp_path / "x-oom").glob("agent-*"))


def test_the_debug_setting_shows_the_traceback_instead(tmp_path: Path) -> None:
    from x_common import env

    done = run(tmp_path, "1", **{env.DEBUG_MODE.name: "1"})
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "can't allocate memory" in done.stderr
    assert "error: out of memory" not in done.stderr
    assert not (tmp_path / "x-oom").exists()


def test_a_rank_that_runs_out_says_so_in_one_line_under_torchrun(tmp_path: Path, launch) -> None:
    script = tmp_path / "greedy.py"
    script.write_text(SCRIPT)
    done = launch(script, 2, "1", env={"TMPDIR": str(tmp_path)}, check=False)
    assert done.returncode != 0
    said = [LINE.search(line) for line in done.stderr.splitlines() if "error: out of memory" in line]
    # Both ranks run out on one batch shape: one agent's ranks say it once (the first to run out).
    assert len(said) == 1 and said[0], done.stderr
    assert "Traceback" not in "\n".join(line for line in done.stderr.splitlines() if line.startswith("[rank"))
    logs = {p.name.split("-")[0] for p in (tmp_path / "x-oom").glob("rank*.log")}
    assert f"rank{said[0].group(1)}" in logs
    assert len(list((tmp_path / "x-oom").glob("agent-*"))) == 1  # the agent's marker: who spoke


GPU_SCRIPT = """
import torch
from x_runtime import Accelerator
accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(16, 2))
kept = torch.empty(2**30, dtype=torch.uint8, device=accelerator.device)  # 1 GiB: a real peak
torch.empty(2**50, dtype=torch.uint8, device=accelerator.device)  # 1 PiB: no GPU has it
"""


@pytest.mark.requires_cuda(1)
def test_a_cuda_out_of_memory_names_the_device_and_its_peak(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "ACCELERATE_"))}
    environ["TMPDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", GPU_SCRIPT], capture_output=True, text=True, env=environ, timeout=300)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    found = re.match(
        r"error: out of memory on rank 0 \(cuda:0\): peak ([\d.]+) GiB reserved of ([\d.]+) GiB; ", lines[0]
    )
    assert found, lines[0]
    assert float(found.group(1)) >= 1.0 and float(found.group(2)) > float(found.group(1))
    assert "OutOfMemoryError" in next((tmp_path / "x-oom").iterdir()).read_text()
