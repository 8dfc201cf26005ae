"""x-launch test: the self-check under a real launch, its report, and how it names a failure."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
from pathlib import Path

import pytest

from x_launch.commands.self_test import SelfCheckOutcome
from x_launch.commands.selfcheck import CheckFailed, check_layout, expected_sum

RUNTIME = importlib.util.find_spec("x_runtime") is not None
CHECKS = ["rendezvous", "rank layout", "device", "all_reduce", "broadcast", "all_gather"] + (
    ["x-runtime"] if RUNTIME else []
)


@pytest.fixture
def x_launch(console_script, tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    clean.update(XDG_CONFIG_HOME=str(tmp_path / "cfg"), HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")

    def go(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [console_script("x-launch"), "test", *args], capture_output=True, text=True, env=clean, timeout=240
        )

    return go


def _check_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("ok   ", "FAIL "))]


def test_two_processes_from_a_config_path_with_spaces_pass_every_check(x_launch, tmp_path: Path) -> None:
    folder = tmp_path / "my configs"
    folder.mkdir()
    config = folder / "launch file.yaml"
    config.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\n")
    # --cpu must not make the config file be skipped (accelerate test --cpu does): 2 processes.
    result = x_launch("--config_file", str(config), "--cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = _check_lines(result.stdout)
    assert [line[5:].split(":")[0] for line in lines] == CHECKS
    assert "ok   rendezvous: 2 processes joined over gloo" in lines
    assert f"ok   all_reduce: sum of rank+1 = {expected_sum(2)}" in lines
    assert f"all {len(CHECKS)} checks passed on 2 process(es)" in result.stdout


def test_one_process_runs_the_checks_without_torchrun(x_launch) -> None:
    result = x_launch("--cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 process(es) via python" in result.stdout
    assert "ok   rendezvous: one process: nothing to join" in result.stdout


def test_a_launch_that_cannot_rendezvous_fails_naming_the_launch(x_launch, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Machine 1 never comes: the rendezvous ends after --rdzv_timeout and the engine exits.
    config = tmp_path / "alone.yaml"
    config.write_text(
        "num_processes: 2\nnum_machines: 2\nmachine_rank: 0\nmain_process_ip: 127.0.0.1\n"
        f"main_process_port: {port}\nuse_cpu: true\nrdzv_timeout: 3\n"
    )
    result = x_launch("--config_file", str(config))
    assert result.returncode == 1
    assert "x-launch test: FAILED at launch: the engine exited" in result.stdout
    assert "ranks [0, 1] did not report" in result.stdout


def test_a_busy_port_in_the_config_is_one_line_and_starts_nothing(x_launch, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "busy.yaml"
        config.write_text(f"num_processes: 2\nuse_cpu: true\nmain_process_port: {port}\n")
        result = x_launch("--config_file", str(config))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: port {port} on 127.0.0.1 is in use (pid {os.getpid()}); pass --main_process_port 0 for a free one"
    ]
    assert "x-launch test:" not in result.stdout


def test_an_invalid_config_is_one_line_and_starts_nothing(x_launch, tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("num_processes: 2\nuse_cpu: true\nmixed_precision: fp32\n")
    result = x_launch("--config_file", str(config))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("Error: ") and "'fp32'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "x-launch test:" not in result.stdout


@pytest.mark.parametrize(
    ("infos", "message"),
    [
        ([{"rank": 0}, {"rank": 0}], "ranks [0, 0] are not 0..1 once each"),
        ([{"rank": 0, "local_rank": 0}, {"rank": 1, "local_rank": 0}], "local ranks on h are [0, 0], expected 0..1"),
        (
            [{"rank": 0, "local_rank": 0, "device": "cuda:0"}, {"rank": 1, "local_rank": 1, "device": "cuda:0"}],
            "processes on h share a device: ['cuda:0', 'cuda:0']",
        ),
    ],
)
def test_layout_check_names_what_is_wrong(infos, message) -> None:
    full = [{"host": "h", "local_rank": 0, "local_world_size": 2, "device": "cpu", **info} for info in infos]
    with pytest.raises(CheckFailed) as caught:
        check_layout(full, 2)
    assert str(caught.value) == message


def test_outcome_reports_the_first_failing_check_once() -> None:
    ok = {"name": "rendezvous", "ok": True, "detail": "2 processes joined over gloo"}
    reports = [
        {"rank": 0, "results": [ok, {"name": "all_reduce", "ok": True, "detail": "sum of rank+1 = 3"}]},
        {"rank": 1, "results": [ok, {"name": "all_reduce", "ok": False, "detail": "rank 1: gave 4, expected 3"}]},
    ]
    outcome = SelfCheckOutcome(2, reports)
    assert outcome.lines() == [
        "ok   rendezvous: 2 processes joined over gloo",
        "FAIL all_reduce: rank 1: gave 4, expected 3",
    ]
    assert outcome.failed_check() == "all_reduce" and outcome.missing_ranks() == []
