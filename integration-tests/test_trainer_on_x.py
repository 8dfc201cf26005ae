"""x's strengths hold under transformers' Trainer with x serving accelerate: preemption and the stall watchdog.

``workers/trainer_job.py`` is a Trainer run (tiny Llama, dropout on) on 2 CPU processes under
``x-launch --provide-accelerate``. Preempted mid-run (USR1 to x-launch), with x's
``PreemptionCallback``, every rank stops at one step, Trainer writes its checkpoint there, and the
run resumed from it ends with the uninterrupted run's weights, bit for bit; with
``CompleteCheckpoints`` a newer folder half-written when the job died is skipped. With a rank stuck inside
a step, the stall watchdog names it and ends the job (exit 124) within its timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and /proc")

WORKER = Path(__file__).resolve().parent / "workers" / "trainer_job.py"
TIMEOUT = 300


def _x_launch(*flags: str) -> list[str]:
    launcher = str(Path(sys.executable).with_name("x-launch"))
    return [launcher, "--num_processes", "2", "--cpu", "--main_process_port", "0", "--provide-accelerate", *flags]


def _finished(argv: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_preempted_trainer_run_saves_at_one_step_and_resumes_exactly(tmp_path: Path, launch_env) -> None:
    environ = launch_env(tmp_path)
    reference = tmp_path / "reference"
    _finished([*_x_launch(), str(WORKER), str(reference)], environ)

    run, progress = tmp_path / "run", tmp_path / "progress"
    argv = [
        *_x_launch(),
        str(WORKER),
        str(run),
        "--preemptible",
        "--complete",
        "--pace",
        "0.3",
        "--progress",
        str(progress),
    ]
    with open(tmp_path / "stderr", "w") as err:
        job = subprocess.Popen(argv, env=environ, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT
    try:
        while not (progress.exists() and int(progress.read_text() or 0) >= 8):
            assert job.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach step 8"
            time.sleep(0.05)
        os.kill(job.pid, signal.SIGUSR1)  # as `scancel --signal=USR1` reaches the launcher
        job.wait(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    stderr = (tmp_path / "stderr").read_text()
    assert job.returncode == 0, stderr[-3000:]
    stopped = int((run / "stopped_at").read_text())
    assert 8 <= stopped < 24, stopped
    assert (run / f"checkpoint-{stopped}").is_dir(), sorted(p.name for p in run.iterdir())
    assert "x-launch: preempted; the ranks saved and exited" in stderr

    assert (run / f"checkpoint-{stopped}" / "x_checkpoint_complete").is_file()
    # A newer folder the job died while writing: transformers' get_last_checkpoint would take it.
    broken = run / f"checkpoint-{stopped + 1}"
    shutil.copytree(run / f"checkpoint-{stopped}", broken)
    (broken / "x_checkpoint_complete").unlink()
    (broken / "optimizer.pt").write_bytes((broken / "optimizer.pt").read_bytes()[:100])

    (run / "final.safetensors").unlink()
    resumed = _finished([*_x_launch(), str(WORKER), str(run), "--complete", "--resume"], environ)
    assert f"{broken} is incomplete" in resumed.stderr
    want, got = load_file(reference / "final.safetensors"), load_file(run / "final.safetensors")
    assert got.keys() == want.keys()
    assert all(torch.equal(got[name], want[name]) for name in want), (
        "the resumed run differs from the uninterrupted one"
    )


def test_a_stuck_rank_in_a_trainer_run_is_named_and_the_job_ends(tmp_path: Path, launch_env) -> None:
    environ = launch_env(tmp_path)
    started = time.monotonic()
    done = subprocess.run(
        [
            *_x_launch("--stall-timeout", "5"),
            str(WORKER),
            str(tmp_path / "run"),
            "--hang-rank",
            "1",
            "--hang-step",
            "3",
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 124, done.stderr[-3000:]
    summary = [line for line in done.stderr.splitlines() if line.startswith("x-launch: ")]
    assert any(
        line.startswith("x-launch: rank 1 is not in a collective: at ") and "trainer_job.py" in line for line in summary
    ), summary
    assert any(line.startswith("x-launch: rank 0 waits in ") for line in summary), summary
    assert time.monotonic() - started < 120
