"""Launches that never trip: free ports, counts the machine can run, addresses, rendezvous timeouts.

Real launches on this machine (gloo); each refusal is checked for its one line, its exit code
and that nothing started.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from x_launch.config.file import ConfigError
from x_launch.config.launch_config import LaunchConfig, Setting
from x_launch.engines.plan import build_plan

ALL_REDUCE = """
import os, sys
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(f"world={dist.get_world_size()} sum={t.item():g} port={os.environ['MASTER_PORT']}")
dist.destroy_process_group()
"""


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    clean.update(XDG_CONFIG_HOME=str(tmp_path / "cfg"), HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    return clean


@pytest.fixture
def run(console_script, clean_env, tmp_path: Path):
    def go(*args: str, timeout: int = 120, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [console_script("x-launch"), *args],
            capture_output=True,
            text=True,
            env={**clean_env, **extra},
            timeout=timeout,
            cwd=tmp_path,
        )

    return go


@pytest.fixture
def marker_script(tmp_path: Path) -> tuple[str, Path]:
    marker = tmp_path / "started"
    path = tmp_path / "train.py"
    path.write_text(f"open({str(marker)!r}, 'w').close()")
    return str(path), marker


def _one_line(out: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert out.returncode == code, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_two_launches_started_together_without_a_port_both_run(console_script, clean_env, tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE)
    for round_ in range(3):
        outs = [tmp_path / f"round{round_}-{job}" for job in "ab"]
        for out in outs:
            out.mkdir()
        jobs = [
            subprocess.Popen(
                [console_script("x-launch"), "--num_processes", "2", "--cpu", str(script), str(out)],
                env=clean_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for out in outs
        ]
        results = [job.communicate(timeout=120) for job in jobs]
        assert [job.returncode for job in jobs] == [0, 0], results
        ports = set()
        for out in outs:
            lines = [(out / f"rank{r}.txt").read_text() for r in range(2)]
            assert [line.split(" port=")[0] for line in lines] == ["world=2 sum=3"] * 2
            ports |= {line.split(" port=")[1] for line in lines}
        assert len(ports) == 2  # each job on its own port


def test_a_port_given_and_in_use_is_one_line_naming_the_holder(run, marker_script) -> None:
    path, marker = marker_script
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = _one_line(run("--num_processes", "2", "--cpu", "--main_process_port", str(port), path), code=1)
    assert line == (
        f"Error: port {port} on 127.0.0.1 is in use (pid {os.getpid()}); pass --main_process_port 0 for a free one"
    )
    assert not marker.exists()


@pytest.mark.parametrize("count", ["100000", str(10**30)])
def test_more_cpu_processes_than_the_machine_can_run_are_refused(run, marker_script, count) -> None:
    path, marker = marker_script
    line = _one_line(run("--num_processes", count, "--cpu", path))
    assert line.startswith(f"Error: {count} CPU processes on this machine is more than it can run well (")
    assert line.endswith("use fewer, or raise the limit with --max_cpu_processes N")
    assert not marker.exists()


def test_the_cpu_process_limit_is_8_per_core_and_can_be_raised(run, marker_script) -> None:
    path, _ = marker_script
    cores = len(os.sched_getaffinity(0))
    assert run("--num_processes", str(8 * cores), "--cpu", "--dry-run", path).returncode == 0
    line = _one_line(run("--num_processes", str(8 * cores + 1), "--cpu", "--dry-run", path))
    assert f"({cores} logical cores, limit {8 * cores} by 8 per core)" in line
    raised = run("--num_processes", str(8 * cores + 1), "--cpu", "--max_cpu_processes", "1000", "--dry-run", path)
    assert raised.returncode == 0, raised.stderr


def _settings(**values: object) -> LaunchConfig:
    return LaunchConfig().updated({key: Setting(value, f"--{key}") for key, value in values.items()})


def test_more_gpu_processes_than_visible_gpus_are_refused() -> None:
    eight = [(9, 0)] * 8
    build_plan(_settings(num_processes=8), ["train.py"], environ={}, gpu_capabilities=eight)
    with pytest.raises(ConfigError, match=r"^16 GPU processes on this machine, but 8 GPUs are visible"):
        build_plan(_settings(num_processes=16), ["train.py"], environ={}, gpu_capabilities=eight)
    with pytest.raises(ConfigError, match=r"^4 GPU processes on this machine, but 2 GPUs are visible"):
        build_plan(
            _settings(num_processes=4), ["train.py"], environ={"CUDA_VISIBLE_DEVICES": "0,1"}, gpu_capabilities=eight
        )
    # Per machine: 16 processes over 2 machines is 8 on each.
    # (as machine 1, which does not hold the rendezvous port: 29500 may be taken here by another job)
    both = _settings(num_processes=16, num_machines=2, machine_rank=1, main_process_ip="127.0.0.1")
    build_plan(both, ["train.py"], environ={}, gpu_capabilities=eight)


def test_an_address_that_does_not_resolve_is_one_line_at_once(run, marker_script) -> None:
    path, marker = marker_script
    start = time.monotonic()
    args = ["--num_processes", "2", "--num_machines", "2", "--cpu", "--main_process_ip", "no.such.host.invalid"]
    line = _one_line(run(*args, path))
    assert line.startswith("Error: --main_process_ip no.such.host.invalid does not resolve (")
    assert time.monotonic() - start < 30 and not marker.exists()
    # One machine with a port given uses the address too.
    one = ["--num_processes", "2", "--cpu", "--main_process_port", "29999", "--main_process_ip", "no.such.host.invalid"]
    assert _one_line(run(*one, path)).startswith("Error: --main_process_ip no.such.host.invalid does not resolve (")


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_rendezvous_that_cannot_complete_ends_after_rdzv_timeout(run, marker_script, backend) -> None:
    path, marker = marker_script
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    start = time.monotonic()
    out = run(
        *("--num_processes", "2", "--num_machines", "2", "--machine_rank", "0", "--cpu"),
        *("--main_process_ip", "127.0.0.1", "--main_process_port", port, "--rdzv_backend", backend),
        *("--rdzv_timeout", "3", path),
    )
    took = time.monotonic() - start
    assert out.returncode == 1, out.stderr
    assert "x-launch: the machines did not all meet within --rdzv_timeout (3 s)" in out.stderr
    assert "Traceback" not in out.stderr and not marker.exists()
    assert took < 60  # torch's default would wait 600 s


def test_rdzv_timeout_reaches_torchrun_under_the_backends_own_key(run, marker_script) -> None:
    path, _ = marker_script
    multi = [
        "--num_processes",
        "2",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--cpu",
        "--main_process_ip",
        "127.0.0.1",
    ]
    static = run(*multi, "--main_process_port", "29555", "--rdzv_timeout", "42", "--dry-run", path)
    assert "--rdzv-conf timeout=42" in static.stdout, static.stderr
    c10d = run(
        *multi, "--main_process_port", "29555", "--rdzv_backend", "c10d", "--rdzv_conf", "a=1", "--dry-run", path
    )
    assert "--rdzv-conf a=1,join_timeout=600" in c10d.stdout, c10d.stderr
    both = run(*multi, "--main_process_port", "29555", "--rdzv_conf", "timeout=5", "--rdzv_timeout", "9", path)
    assert "both set the rendezvous timeout: give one" in _one_line(both)


def test_a_folder_given_as_the_script_is_named_as_a_folder(run, tmp_path: Path) -> None:
    (tmp_path / "cfgdir").mkdir()
    line = _one_line(run("cfgdir"))
    assert line == "Error: cfgdir is a folder, not a script: give the script inside it, e.g. cfgdir/train.py"


def test_scratch_log_folders_are_removed_even_after_a_killed_run(run, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # What a SIGKILLed x-launch leaves: a folder named for a pid that no longer runs.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (scratch / f"x-launch-{dead.pid}-0123abcd" / "run").mkdir(parents=True)
    ok = tmp_path / "ok.py"
    ok.write_text("pass")
    fail = tmp_path / "fail.py"
    fail.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)")
    assert run("--num_processes", "2", "--cpu", str(ok), TMPDIR=str(scratch)).returncode == 0
    assert run("--num_processes", "2", "--cpu", str(fail), TMPDIR=str(scratch)).returncode == 1
    assert list(scratch.iterdir()) == []


def test_more_cpu_processes_than_cores_start_with_one_warning_and_no_straggler_report() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    fits = build_plan(_settings(num_processes=cores, use_cpu=True), ["train.py"], environ={}, gpu_capabilities=[])
    assert fits.warnings == []
    crowded = build_plan(
        _settings(num_processes=cores + 1, use_cpu=True), ["train.py"], environ={}, gpu_capabilities=[]
    )
    assert crowded.warnings == [
        f"x-launch: {cores + 1} CPU processes on {cores} logical core{'s' if cores > 1 else ''} take turns on them: "
        "the job runs slower than with fewer, and its step times say little (no straggler report at the end)"
    ]
    assert "take turns" not in crowded.describe()  # --dry-run shows the plan; the warning is the job's
    on_gpus = build_plan(_settings(num_processes=2), ["train.py"], environ={}, gpu_capabilities=[(9, 0)] * 2)
    assert on_gpus.warnings == []  # a GPU's process waits on its GPU, not on a core
