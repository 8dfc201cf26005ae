"""``x-launch [options] TARGET``: the plan it prints, and real launches on this machine (gloo)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ALL_REDUCE = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
line = (f"rank={dist.get_rank()} world={dist.get_world_size()} local={os.environ['LOCAL_RANK']} sum={t.item():g} "
        f"mp={os.environ.get('X_MIXED_PRECISION')} type={os.environ.get('X_DISTRIBUTED_TYPE')} args={sys.argv[1:]}")
print(line, flush=True)
if os.environ.get("OUT_DIR"):  # one file per rank: two ranks printing to one pipe may interleave
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{dist.get_rank()}.txt"), "w") as f:
        f.write(line)
dist.destroy_process_group()
"""

ONE_PROCESS = """
import os, sys
print(f"launched={os.environ.get('X_LAUNCHED')} gas={os.environ.get('X_GRADIENT_ACCUMULATION_STEPS')} "
      f"rank={os.environ.get('RANK')} args={sys.argv[1:]}", flush=True)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""

FAIL_ON_RANK_1 = """
import os, sys, time
if os.environ["RANK"] == "1":
    sys.exit(7)
time.sleep(60)
"""


@pytest.fixture
def run(console_script, tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    clean.update(XDG_CONFIG_HOME=str(tmp_path / "cfg"), HF_HOME=str(tmp_path / "hf"))

    def go(*args: str, extra_env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [console_script("x-launch"), *args],
            capture_output=True,
            text=True,
            env={**clean, **(extra_env or {})},
            timeout=timeout,
            cwd=tmp_path,
        )

    return go


@pytest.fixture
def script(tmp_path: Path):
    def write(name: str, code: str) -> str:
        path = tmp_path / name
        path.write_text(code)
        return str(path)

    return write


def test_dry_run_prints_sources_command_and_environment_and_starts_nothing(run, script) -> None:
    path = script("train.py", "raise SystemExit('must not run')")
    out = run(
        "--num_processes",
        "2",
        "--cpu",
        "--mixed_precision",
        "bf16",
        "--dry-run",
        path,
        "--epochs",
        "3",
        extra_env={"X_LAUNCH_GRADIENT_ACCUMULATION_STEPS": "4"},
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "  num_processes: 2  [--num_processes]" in text
    assert "  mixed_precision: bf16  [--mixed_precision]" in text
    assert "  gradient_accumulation_steps: 4  [X_LAUNCH_GRADIENT_ACCUMULATION_STEPS]" in text
    assert "engine: torchrun" in text
    command = re.search(r"^command: .*$", text, re.M).group(0)
    assert re.fullmatch(
        r"command: \S+ -m x_launch\.run\.torchrun_agent --nnodes 1 --nproc-per-node 2 --standalone "
        r"--max-restarts 0 --rdzv-conf join_timeout=600 --log-dir \S+/x-launch-\d+-[0-9a-f]{8} --redirects 2 "
        + re.escape(f"{path} --epochs 3"),
        command,
    ), command
    for line in (
        "X_LAUNCHED=1",
        "X_MIXED_PRECISION=bf16",
        "X_USE_CPU=1",
        "X_DISTRIBUTED_TYPE=MULTI_CPU",
        "X_GRADIENT_ACCUMULATION_STEPS=4",
    ):
        assert f"  {line}" in text
    assert "X_FSDP_" not in text  # sections travel only when set


def test_dry_run_imports_no_torch(tmp_path: Path, script) -> None:
    path = script("train.py", "")
    code = (
        "import sys\nfrom x_launch.cli import main\n"
        f"try:\n    main(['--num_processes', '2', '--dry-run', {path!r}])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "sys.exit('torch imported' if 'torch' in sys.modules else 0)\n"
    )
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HF_HOME": str(tmp_path / "hf")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)


def test_config_file_and_multi_machine_plan(run, tmp_path: Path) -> None:
    cfg = tmp_path / "two.yaml"
    cfg.write_text(
        "distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 8\nmachine_rank: 1\n"
        "main_process_ip: 10.1.2.3\nmain_process_port: 6000\nrdzv_backend: c10d\n"
        "fsdp_config:\n  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
    )
    out = run("--config_file", str(cfg), "--dry-run", "-m", "mypkg.train")
    assert out.returncode == 0, out.stderr
    # --local-addr: this machine's address on the route to 10.1.2.3, whichever it is here
    assert re.search(
        r"-m x_launch\.run\.torchrun_agent --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint 10\.1\.2\.3:6000 "
        r"--rdzv-id x-6000 (--local-addr \S+ )?--max-restarts 0 --rdzv-conf join_timeout=600 --log-dir ",
        out.stdout,
    ), out.stdout
    assert " --redirects 2 -m mypkg.train" in out.stdout
    assert "  X_DISTRIBUTED_TYPE=MULTI_GPU" in out.stdout
    assert "  X_FSDP_TRANSFORMER_CLS_TO_WRAP=LlamaDecoderLayer" in out.stdout


def test_two_processes_on_cpu_form_one_world(run, script, tmp_path: Path) -> None:
    # Accelerate's `launch --cpu --num_processes 2` starts one process; we start two, in one world.
    path = script("allreduce.py", ALL_REDUCE)
    args = ("--num_processes", "2", "--cpu", "--main_process_port", "0", "--mixed_precision", "bf16", path, "--x", "1")
    out = run(*args, extra_env={"OUT_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(p.read_text() for p in tmp_path.glob("rank*.txt"))
    assert lines == [
        "rank=0 world=2 local=0 sum=3 mp=bf16 type=MULTI_CPU args=['--x', '1']",
        "rank=1 world=2 local=1 sum=3 mp=bf16 type=MULTI_CPU args=['--x', '1']",
    ]


def test_three_processes_with_per_rank_logs(run, script, tmp_path: Path) -> None:
    path = script("allreduce.py", ALL_REDUCE)
    logs = tmp_path / "logs"
    out = run("--num_processes", "3", "--cpu", "--main_process_port", "0", "--log_dir", str(logs), path)
    assert out.returncode == 0, out.stderr
    found = sorted(p.read_text().strip() for p in logs.rglob("stdout.log"))
    assert [line.split(" mp=")[0] for line in found] == [f"rank={r} world=3 local={r} sum=6" for r in range(3)]


def test_one_process_runs_the_interpreter_directly_and_keeps_its_exit_code(run, script) -> None:
    path = script("one.py", ONE_PROCESS)
    out = run("--gradient_accumulation_steps", "8", path, "a", "--b")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "launched=1 gas=8 rank=None args=['a', '--b']"
    out = run(path, extra_env={"EXIT_WITH": "5"})
    assert out.returncode == 5


def test_a_failing_rank_stops_the_job_with_a_non_zero_exit(run, script) -> None:
    path = script("fail.py", FAIL_ON_RANK_1)
    out = run("--num_processes", "2", "--cpu", "--main_process_port", "0", path, timeout=60)
    assert out.returncode != 0
    assert "x-launch: rank 1 (local rank 1 on localhost) exited with code 7" in out.stderr
    # torchrun's own traceback and summary stay out of the terminal unless --debug.
    assert "Traceback" not in out.stderr and "ChildFailedError" not in out.stderr and "exitcode  :" not in out.stderr
    out = run("--num_processes", "2", "--cpu", "--debug", path, timeout=60)
    assert out.returncode != 0 and "ChildFailedError" in out.stderr and "exitcode  : 7" in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "Error: script missing.py does not exist (to run a module, use -m missing.py)"),
        (
            ["--num_processes", "3", "--num_machines", "2", "SCRIPT"],
            "num_processes 3 is not a multiple of num_machines 2",
        ),
        (["--num_processes", "0", "SCRIPT"], "--num_processes: '0' is not valid: expected an integer >= 1"),
        (["--main_process_port", "70000", "SCRIPT"], "expected an integer from 0 to 65535"),
        (["--num_machines", "2", "--num_processes", "2", "SCRIPT"], "needs --main_process_ip"),
        (["--machine_rank", "1", "SCRIPT"], "machine_rank 1 must be below num_machines 1"),
        (["--num_procs", "2", "SCRIPT"], "No such option '--num_procs'. (Did you mean one of:"),
        (["--tee", "SCRIPT"], "--tee copies the per-rank log files to the terminal; give --log_dir too"),
    ],
)
def test_bad_launches_are_one_line_exit_2_and_start_nothing(run, script, tmp_path: Path, args, message) -> None:
    marker = tmp_path / "started"
    path = script("train.py", f"open({str(marker)!r}, 'w').close()")
    out = run(*[path if a == "SCRIPT" else a for a in args])
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr
    assert not marker.exists()


def test_two_launches_with_num_machines_2_form_one_world_over_loopback(console_script, script, tmp_path: Path) -> None:
    import socket

    path = script("allreduce.py", ALL_REDUCE)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "cfg"), HF_HOME=str(tmp_path / "hf"), OUT_DIR=str(tmp_path))
    common = ["--num_processes", "4", "--num_machines", "2", "--cpu", "--main_process_ip", "127.0.0.1"]
    machines = [
        subprocess.Popen(
            [console_script("x-launch"), *common, "--machine_rank", rank, "--main_process_port", port, path],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in ("0", "1")
    ]
    results = [m.communicate(timeout=120) for m in machines]
    assert [m.returncode for m in machines] == [0, 0], results
    lines = sorted(p.read_text() for p in tmp_path.glob("rank*.txt"))
    assert [line.split(" mp=")[0] for line in lines] == [f"rank={r} world=4 local={r % 2} sum=10" for r in range(4)]


@pytest.mark.parametrize(
    ("capabilities", "refused"),
    [([(7, 0), (7, 5)], True), ([(8, 0)], False), ([(7, 0), (9, 0)], False), ([], False)],
)
def test_bf16_is_refused_only_where_every_gpu_predates_it(capabilities, refused) -> None:
    from x_launch.config.file import ConfigError
    from x_launch.config.resolve import resolve
    from x_launch.engines.plan import build_plan

    settings = resolve(None, {"mixed_precision": "bf16"}, environ={})
    if not refused:
        # Not refused (two GPUs also mean two processes now, as under accelerate launch).
        plan = build_plan(settings, ["t.py"], environ={}, gpu_capabilities=capabilities)
        assert plan.settings.mixed_precision == "bf16" and plan.settings.num_processes == max(len(capabilities), 1)
        return
    with pytest.raises(ConfigError) as caught:
        build_plan(settings, ["t.py"], environ={}, gpu_capabilities=capabilities)
    assert str(caught.value) == (
        "mixed_precision bf16 needs GPUs of compute capability 8.0 or newer (Ampere+); these have 7.0, 7.5: "
        "use fp16, or --cpu"
    )
