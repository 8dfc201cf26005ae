"""Preemption under x-launch: a signal mid-training, every rank stops at one step, saves, resumes exactly.

Two CPU processes train ``workers/train_checkpoints.py --preemptible`` (shuffling, dropout and
noise from the global generator on). x-launch is signalled mid-run: USR1 to x-launch alone (as
``scancel --signal=USR1`` reaches a launcher), and TERM to every process of the job, as SLURM's
process tracking delivers it (``--preemption_signals USR1,TERM``). Every rank records the step at
which ``preemption_requested`` turned True; the resumed run's final weights must equal an
uninterrupted run's bit for bit. On the local SLURM cluster, an sbatch job with
``srun x-launch --requeue`` is signalled, requeues itself and finishes with the same weights.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from process_tree import descendants
from safetensors.torch import load_file

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")

WORKER = Path(__file__).resolve().parent / "workers" / "train_checkpoints.py"
TRAIN = ("--dropout", "0.2", "--epochs", "2", "--save-every", "7", "--preemptible")
TIMEOUT = 180


def _x_launch(*flags: str) -> list[str]:
    launcher = str(Path(sys.executable).with_name("x-launch"))
    return [launcher, "--num_processes", "2", "--cpu", "--main_process_port", "0", *flags]


def _run(argv: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs from the uninterrupted run"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, launch_env) -> dict[str, torch.Tensor]:
    """The uninterrupted run's final weights (reading preemption_requested every step)."""
    root = tmp_path_factory.mktemp("reference")
    out = root / "final.safetensors"
    _run([*_x_launch(), str(WORKER), str(root / "proj"), str(out), *TRAIN], launch_env(root))
    return _weights(out)


def _preempt(root: Path, environ: dict[str, str], flags: tuple[str, ...], send) -> subprocess.Popen:
    """Start the job, wait until it is 6 steps in, call ``send(x-launch's pid)``, wait for the end."""
    progress = root / "progress"
    argv = [*_x_launch(*flags), str(WORKER), str(root / "proj"), str(root / "final.safetensors"), *TRAIN]
    argv += ["--pace", "0.05", "--progress", str(progress)]
    with open(root / "stderr", "w") as err:
        job = subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT
    while not (progress.exists() and int(progress.read_text() or 0) >= 6):
        assert job.poll() is None, (root / "stderr").read_text()[-3000:]
        assert time.monotonic() < deadline, "the job did not reach step 6"
        time.sleep(0.02)
    send(job.pid)
    try:
        job.wait(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    return job


def _resume_and_compare(root: Path, environ: dict[str, str], reference: dict[str, torch.Tensor]) -> None:
    steps = {path.name: int(path.read_text()) for path in sorted((root / "proj").glob("preempted_rank*"))}
    assert list(steps) == ["preempted_rank0", "preempted_rank1"], steps
    assert len(set(steps.values())) == 1, f"the ranks stopped at different steps: {steps}"
    assert 6 <= steps["preempted_rank0"] < 16, steps  # mid-run: 2 epochs of 8 steps
    assert not (root / "final.safetensors").exists()
    resumed = _run(
        [*_x_launch(), str(WORKER), str(root / "proj"), str(root / "final.safetensors"), *TRAIN, "--resume"], environ
    )
    assert f"at step {steps['preempted_rank0']}" in resumed.stdout, resumed.stdout
    _assert_same(_weights(root / "final.safetensors"), reference)


def test_usr1_to_x_launch_stops_every_rank_at_one_step_and_the_resume_is_exact(
    tmp_path: Path, launch_env, reference
) -> None:
    environ = launch_env(tmp_path)
    job = _preempt(tmp_path, environ, (), lambda pid: os.kill(pid, signal.SIGUSR1))
    stderr = (tmp_path / "stderr").read_text()
    assert job.returncode == 0, stderr[-3000:]
    assert "x-launch: preempted; the ranks saved and exited" in stderr
    assert "preempted at step" in job.stdout.read()
    _resume_and_compare(tmp_path, environ, reference)


def test_term_to_every_process_is_a_preemption_when_configured(tmp_path: Path, launch_env, reference) -> None:
    environ = launch_env(tmp_path)

    def everyone(pid: int) -> None:
        # As SLURM's process tracking signals a step: the launcher, torchrun's agent and the workers.
        tree = descendants(pid)
        assert len(tree) >= 3, tree  # agent and two workers
        for target in (pid, *tree):
            os.kill(target, signal.SIGTERM)

    job = _preempt(tmp_path, environ, ("--preemption_signals", "USR1,TERM"), everyone)
    assert job.returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
    _resume_and_compare(tmp_path, environ, reference)


def test_requeue_outside_slurm_is_refused_with_one_line(tmp_path: Path, launch_env) -> None:
    out = subprocess.run(
        [*_x_launch("--requeue"), str(WORKER), "p", "o"], env=launch_env(tmp_path), capture_output=True, text=True
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "Error: --requeue needs a SLURM batch job (SLURM_JOB_ID is not set): "
        "run x-launch inside the sbatch script, or drop --requeue"
    ]


def test_an_unknown_preemption_signal_is_refused_with_one_line(tmp_path: Path, launch_env) -> None:
    out = subprocess.run(
        [*_x_launch("--preemption_signals", "USR1,KILL"), str(WORKER), "p", "o"],
        env=launch_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "Error: preemption_signals: 'KILL' cannot be a preemption signal; "
        "use some of USR1, USR2, TERM, HUP (e.g. --preemption_signals USR1,TERM)"
    ]


SBATCH = """#!/bin/bash
#SBATCH --nodes=1 --ntasks=1 --cpus-per-task=2 --output={out}/slurm-%j.out --open-mode=append {sbatch}
echo "start $SLURM_JOB_ID restart ${{SLURM_RESTART_COUNT:-0}} at $(date +%s)"
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then first="{first}"; else first=""; fi
srun {launcher} --num_processes 2 --cpu --requeue {worker} {proj} {final} {train} --resume-if-any $first
echo "srun exited $? at $(date +%s)"
"""


def _submit(root: Path, environ: dict[str, str], *, sbatch: str = "", first: str = "") -> str:
    """Submit the job script (``first``: arguments for the first run only); its job id."""
    script = root / "job.sh"
    launcher = Path(sys.executable).with_name("x-launch")
    script.write_text(
        SBATCH.format(
            out=root,
            sbatch=sbatch,
            first=first,
            launcher=launcher,
            worker=WORKER,
            proj=root / "proj",
            final=root / "final.safetensors",
            train=" ".join(TRAIN[:-1]),  # --preemptible: in ``first`` or not at all
        )
    )
    name = f"x-preempt-{uuid.uuid4().hex[:8]}"
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={name}", str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=root,
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def _wait_done(root: Path, job_id: str, deadline: float) -> None:
    while not (root / "final.safetensors").exists() or _state(job_id) not in ("COMPLETED", ""):
        state = _state(job_id)
        assert state not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), f"{state}: {_logs(root)}"
        assert time.monotonic() < deadline, f"job {job_id} did not finish: {_logs(root)}"
        time.sleep(0.5)


def _assert_requeued_once_and_exact(root: Path, job_id: str, reference: dict[str, torch.Tensor]) -> str:
    logs = _logs(root)
    assert f"start {job_id} restart 0" in logs and f"start {job_id} restart 1" in logs, logs
    assert f"start {job_id} restart 2" not in logs, logs
    assert logs.count(f"x-launch: preempted; the ranks exited; requeued SLURM job {job_id}") == 1, logs
    steps = {int(p.read_text()) for p in (root / "proj").glob("preempted_rank*")}
    assert len(steps) == 1, f"{steps}\n{logs}"
    assert "rank 0: resumed from checkpoint_" in logs and f"at step {steps.pop()}" in logs, logs
    _assert_same(_weights(root / "final.safetensors"), reference)
    return logs


SLURM_CONF = Path("/etc/slurm/slurm.conf")
# SLURM holds a requeued job for the credential lifetime (AuthInfo cred_expire, 120 s by default,
# so that the old job's credentials have expired on the nodes), then starts it at the next
# scheduling pass (backfill: every 30 s). Both are shortened on the local test cluster.
FAST_REQUEUE = ("AuthInfo=cred_expire=5", "SchedulerParameters=bf_interval=1")


def _restart_controller(conf: str) -> None:
    pid_file = next(line.split("=", 1)[1] for line in conf.splitlines() if line.startswith("SlurmctldPidFile="))
    pid = int(Path(pid_file).read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    subprocess.run(["/usr/sbin/slurmctld", "-i"], check=True, timeout=30)  # -i: keep the saved state
    while time.monotonic() < deadline + 60:
        nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10).stdout.split()
        if nodes and all(state in ("idle", "mix", "alloc") for state in nodes):
            return
        time.sleep(0.3)
    pytest.fail(f"the SLURM controller did not come back after a restart: {nodes}")


@pytest.fixture(scope="module")
def fast_requeue():
    """The local cluster's slurm.conf with FAST_REQUEUE (the controller restarted), restored afterwards."""
    if not SLURM_CONF.is_file() or os.geteuid() != 0:
        pytest.skip("shortening the requeue delay needs the local test cluster's /etc/slurm/slurm.conf and root")
    original = SLURM_CONF.read_text()
    if "cred_expire=" in original:
        yield  # already set (by an earlier run, or by the cluster's own config)
        return
    changed = original.rstrip("\n") + "\n" + "\n".join(FAST_REQUEUE) + "\n"
    SLURM_CONF.write_text(changed)
    try:
        _restart_controller(changed)
        yield
    finally:
        SLURM_CONF.write_text(original)
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, timeout=60)


@pytest.mark.requires_slurm
def test_slurm_job_signalled_with_usr1_requeues_and_resumes_exactly(
    tmp_path: Path, launch_env, reference, fast_requeue
) -> None:
    environ = {**launch_env(tmp_path), "PYTHONUNBUFFERED": "1"}
    progress = tmp_path / "progress"
    job_id = _submit(tmp_path, environ, first=f"--preemptible --pace 0.3 --progress {progress}")
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (progress.exists() and int(progress.read_text() or 0) >= 6):
            assert time.monotonic() < deadline, f"job {job_id} did not reach step 6: {_logs(tmp_path)}"
            time.sleep(0.1)
        signalled = subprocess.run(["scancel", "--signal=USR1", job_id], capture_output=True, text=True, timeout=30)
        assert signalled.returncode == 0, signalled.stderr
        _wait_done(tmp_path, job_id, deadline + TIMEOUT)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    _assert_requeued_once_and_exact(tmp_path, job_id, reference)


@pytest.mark.requires_slurm
def test_slurm_signal_before_the_time_limit_requeues_and_resumes_exactly(
    tmp_path: Path, launch_env, reference, fast_requeue
) -> None:
    """``#SBATCH --time=2 --signal=USR1@60``: USR1 30 to 60 s in. slurmctld checks time limits every
    30 s and sends the signal at the first check once fewer than warn time + 30 s are left, so
    ``--time=1 --signal=USR1@50`` could land in the job's first second, before srun had started
    x-launch's interpreter (seen twice: "srun exited 138" the second the job started; a signal
    that lands later while x-launch starts is held, the unit tests show that). The first run is
    slow (5 s a step: 16 steps outlast the signal) and stops for it; the requeued one (not
    preemptible, fast) finishes, and a USR1 reaching it then is said and requeues nothing."""
    environ = {**launch_env(tmp_path), "PYTHONUNBUFFERED": "1"}
    job_id = _submit(tmp_path, environ, sbatch="--time=2 --signal=USR1@60", first="--preemptible --pace 5")
    try:
        _wait_done(tmp_path, job_id, time.monotonic() + TIMEOUT)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    _assert_requeued_once_and_exact(tmp_path, job_id, reference)


def _state(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip()


def _logs(folder: Path) -> str:
    return "\n".join(path.read_text() for path in sorted(folder.glob("slurm-*.out")))
