"""Preemption and requeue in x-launch: the signals it relays, the workers' environment, requeue."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from x_common import env
from x_launch.config.file import ConfigError
from x_launch.config.resolve import resolve
from x_launch.engines import slurm as slurm_plan
from x_launch.engines.preflight import RequeueRefused, check_requeue
from x_launch.run.preemption import PreemptionRelay, parse_signals, requeue_job


def test_signal_names_in_any_spelling_and_the_default() -> None:
    assert parse_signals("usr1,SIGTERM, HUP") == (signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP)
    assert parse_signals(None) == (signal.SIGUSR1,)
    assert parse_signals("USR1,USR1") == (signal.SIGUSR1,)


@pytest.mark.parametrize("name", ["INT", "KILL", "STOP", "NOPE"])
def test_signals_that_cannot_mean_preemption_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"'{name}' cannot be a preemption signal; use some of USR1, USR2, TERM, HUP"):
        parse_signals(f"USR1,{name}")


def test_requeue_needs_a_slurm_job() -> None:
    with pytest.raises(RequeueRefused, match="--requeue needs a SLURM batch job") as info:
        check_requeue(True, {})
    assert info.value.exit_code == 1
    check_requeue(True, {"SLURM_JOB_ID": "7"})
    check_requeue(False, {})


def test_the_relay_keeps_its_signals_away_from_torchruns_agent(tmp_path: Path) -> None:
    default = PreemptionRelay(parse_signals(None), folder=str(tmp_path / "r"))
    assert default.environment() == {
        env.PREEMPTION_FILE.name: str(tmp_path / "r" / "preempted"),
        env.TORCHRUN_SIGNALS.name: "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    }
    assert default.death_signal() == signal.SIGTERM
    term = PreemptionRelay(parse_signals("USR1,TERM"), folder=str(tmp_path / "t"))
    assert term.environment()[env.TORCHRUN_SIGNALS.name] == "SIGINT,SIGHUP,SIGQUIT"
    assert term.death_signal() == signal.SIGINT  # the agent ignores TERM then


def test_the_marker_appears_once_on_the_first_signal_and_goes_with_the_launch(tmp_path: Path) -> None:
    relay = PreemptionRelay(parse_signals(None), folder=str(tmp_path / "r"))
    assert not Path(relay.marker).exists()
    relay.on_signal(signal.SIGUSR1, None)
    relay.on_signal(signal.SIGUSR1, None)
    assert relay.requested and Path(relay.marker).read_text() == f"{int(signal.SIGUSR1)}\n"
    relay.close()
    assert not Path(relay.folder).exists()


def test_requeue_and_preemption_signals_reach_the_x_launch_on_every_node() -> None:
    settings = resolve(None, {"requeue": True, "preemption_signals": "USR1,TERM"}, environ={})
    assert slurm_plan.forwarded_args(settings) == ["--preemption_signals", "USR1,TERM", "--requeue"]


@pytest.fixture
def fake_scontrol(tmp_path: Path, monkeypatch) -> Path:
    """An ``scontrol`` on PATH that records its arguments (exit code from FAKE_SCONTROL_EXIT)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.args"
    script = bin_dir / "scontrol"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            echo "$@" >> {record}
            [ "${{FAKE_SCONTROL_EXIT:-0}}" = 0 ] || {{ echo "slurm_requeue error: Job is pending" >&2; exit 1; }}
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def test_task_0_requeues_the_job(fake_scontrol: Path) -> None:
    code, line = requeue_job({"SLURM_JOB_ID": "41", "SLURM_PROCID": "0"})
    assert (code, line) == (0, "x-launch: preempted; the ranks exited; requeued SLURM job 41")
    assert fake_scontrol.read_text() == "requeue 41\n"


def test_other_tasks_leave_the_requeue_to_task_0(fake_scontrol: Path) -> None:
    code, _line = requeue_job({"SLURM_JOB_ID": "41", "SLURM_PROCID": "1"})
    assert code == 0 and not fake_scontrol.exists()


def test_a_failed_requeue_is_one_line_and_exit_1(fake_scontrol: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SCONTROL_EXIT", "1")
    assert requeue_job({"SLURM_JOB_ID": "41"}) == (
        1,
        "x-launch: preempted, but scontrol requeue 41 failed: slurm_requeue error: Job is pending",
    )


# A rank without torch: waits for the marker and, as the runtime does, says it stopped for it.
_ONE_RANK = """
import os, pathlib, sys, time
marker = pathlib.Path(os.environ["X_PREEMPTION_FILE"])
pathlib.Path(sys.argv[1]).write_text(os.environ["X_PREEMPTION_SIGNALS"])
while not marker.exists():
    time.sleep(0.02)
if sys.argv[2] == "stops":
    pathlib.Path(str(marker) + ".seen").touch()
print("saw the marker", flush=True)
"""


def _one_rank(tmp_path: Path, sig: int, behaviour: str) -> tuple[int, str, str]:
    script, ready = tmp_path / "train.py", tmp_path / "ready"
    script.write_text(_ONE_RANK)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "SLURM_"))}
    launcher = str(Path(sys.executable).with_name("x-launch"))
    argv = [launcher, "--cpu", "--preemption_signals", "USR1,TERM", str(script), str(ready), behaviour]
    job = subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if ready.exists() or job.poll() is not None:
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert ready.read_text() == "USR1,TERM"
    os.kill(job.pid, sig)
    out, err = job.communicate(timeout=60)
    return job.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_one_process_launch_survives_the_signal_and_exits_0(sig: int, tmp_path: Path) -> None:
    """The script's process is started with the signals ignored; x-launch creates the marker."""
    code, out, err = _one_rank(tmp_path, sig, "stops")
    assert code == 0, err
    assert out == "saw the marker\n"
    assert err.strip().splitlines()[-1] == "x-launch: preempted; the ranks saved and exited"


def test_a_signal_no_rank_stopped_for_is_said_and_requeues_nothing(tmp_path: Path) -> None:
    code, out, err = _one_rank(tmp_path, signal.SIGUSR1, "finishes")
    assert code == 0 and out == "saw the marker\n", err
    assert err.strip().splitlines()[-1].startswith("x-launch: a preemption signal came, but no rank stopped for it")


def _blocked_on_a_fifo_config(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    """x-launch started with a FIFO as its config file: it waits there, well before any launch.

    Returns the process and the FIFO's write end, opened once x-launch has opened it to read.
    """
    script, ready = tmp_path / "train.py", tmp_path / "ready"
    script.write_text(_ONE_RANK)
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "SLURM_"))}
    launcher = str(Path(sys.executable).with_name("x-launch"))
    argv = [launcher, "--config_file", str(fifo), "--cpu", *flags, str(script), str(ready), "stops"]
    job = subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(1200):
        try:
            return job, os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until x-launch reads it
        except OSError:
            assert job.poll() is None, job.communicate()
            subprocess.run(["sleep", "0.05"], check=True)
    job.kill()
    pytest.fail("x-launch never opened its config file")


def test_a_preemption_signal_while_x_launch_starts_is_acted_on_once_the_ranks_run(tmp_path: Path) -> None:
    """SLURM's --signal can land while x-launch is still reading its config: USR1's default action
    would end it there ("task 0: User defined signal 1") and the job would neither train nor requeue."""
    job, config = _blocked_on_a_fifo_config(tmp_path, "--preemption_signals", "USR1")
    os.kill(job.pid, signal.SIGUSR1)
    os.write(config, b"num_processes: 1\n")
    os.close(config)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert out == "saw the marker\n"  # the marker was there before the rank's first look
    assert (tmp_path / "ready").read_text() == "USR1"
    assert err.strip().splitlines()[-1] == "x-launch: preempted; the ranks saved and exited"


def test_an_early_signal_the_launch_does_not_take_for_preemption_still_ends_x_launch(tmp_path: Path) -> None:
    job, config = _blocked_on_a_fifo_config(tmp_path, "--preemption_signals", "TERM")
    os.kill(job.pid, signal.SIGUSR1)
    os.write(config, b"num_processes: 1\n")
    os.close(config)
    job.communicate(timeout=60)
    assert job.returncode == -signal.SIGUSR1
    assert not (tmp_path / "ready").exists()  # nothing was started
