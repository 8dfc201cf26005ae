"""Real multi-process runs for x-runtime tests: torchrun workers on CPU with gloo.

A test writes (or points at) a worker script, starts it on N processes with
``run_workers(script, n, *args)``, and reads what each rank wrote under ``out_dir``. Ranks report
through files, never through one shared pipe where their lines could interleave.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
_FOREIGN = (
    "X_",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_",
    "SLURM_",
    "TORCHELASTIC_",
    "PJRT_",  # torch_xla's device choice: set, it would turn every Accelerator into an XLA one
)


@pytest.fixture(autouse=True)
def _single_process_environment(monkeypatch) -> None:
    """In-process tests see no launcher: no x contract, torchrun or SLURM variables."""
    for name in list(os.environ):
        if name.startswith(_FOREIGN):
            monkeypatch.delenv(name)


def _worker_env(extra: dict[str, str] | None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    # Where x runs from its sources (.ci/device-check), the caller's PYTHONPATH is how workers find it.
    path = os.pathsep.join(p for p in (str(WORKERS), os.environ.get("PYTHONPATH", "")) if p)
    environ.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    environ.update(extra or {})
    return environ


def run_workers(
    script: str | Path,
    nprocs: int,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``nprocs`` processes under torchrun (one process: the interpreter)."""
    if nprocs == 1:
        command = [sys.executable, str(script), *args]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nprocs}",
            str(script),
            *args,
        ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_worker_env(env))
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n--- stdout ---\n{result.stdout[-4000:]}"
            f"\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


@pytest.fixture
def workers(tmp_path) -> Callable[..., list[dict]]:
    """Run a worker script and return what each rank wrote to ``<out>/rank<N>.json``.

    The script receives the output folder as its first argument; ``_helpers.report`` writes the
    per-rank JSON file.
    """

    def run(script: str | Path, nprocs: int, *args: str, env: dict[str, str] | None = None) -> list[dict]:
        out = tmp_path / f"out-{nprocs}-{len(list(tmp_path.glob('out-*')))}"
        out.mkdir()
        path = Path(script)
        if not path.is_absolute():
            path = WORKERS / path
        run_workers(path, nprocs, str(out), *args, env=env)
        reports = sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        assert len(reports) == nprocs, f"expected {nprocs} rank reports, found {[p.name for p in reports]}"
        return [json.loads(p.read_text()) for p in reports]

    return run


@pytest.fixture
def inline_worker(tmp_path) -> Callable[[str], Path]:
    """Write a worker script from source text; it can ``from _helpers import report``."""

    def write(source: str) -> Path:
        path = tmp_path / f"worker_{len(list(tmp_path.glob('worker_*.py')))}.py"
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture(scope="session")
def launch() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_workers`` for tests that read rank files themselves (scripts named relative to workers/)."""

    def run(script: str | Path, nprocs: int, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
        path = Path(script)
        return run_workers(path if path.is_absolute() else WORKERS / path, nprocs, *args, **kwargs)

    return run
