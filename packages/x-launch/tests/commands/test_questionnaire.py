"""``x-launch config``: questions answered on stdin, bad answers asked again, the file written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml


@pytest.fixture
def run(console_script, tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_LAUNCH_", "X_CONFIG_FILE"))}
    clean.update(XDG_CONFIG_HOME=str(tmp_path / "cfg"), HF_HOME=str(tmp_path / "hf"))

    def go(answers: list[str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [console_script("x-launch"), "config", *args],
            input="\n".join(answers) + "\n",
            capture_output=True,
            text=True,
            env=clean,
            timeout=120,
        )

    return go


def test_enter_accepts_every_default(run, tmp_path: Path) -> None:
    out = run([""] * 6)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "cfg" / "x" / "launch.yaml"
    assert out.stdout.rstrip().endswith(f"wrote {path}")
    # This CPU-only machine: one process, on CPU, no mixed precision, nothing else asked.
    assert yaml.safe_load(path.read_text()) == {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO",
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": 1,
        "use_cpu": True,
        "mixed_precision": "no",
    }


def test_invalid_answers_are_asked_again_with_the_reason(run, tmp_path: Path) -> None:
    answers = [
        "several machines",
        "multi_cpu",
        "0",
        "2",
        "1",
        "10.0.0.1",
        "70000",
        "29501",
        "c10d",
        "2",
        "fp32",
        "bf16",
        "",
    ]
    out = run(answers)
    assert out.returncode == 0, out.stderr
    assert "Error: num_machines: '0' is not valid: expected an integer >= 1" in out.stdout + out.stderr
    assert (
        "Error: main_process_port: '70000' is not valid: expected an integer from 0 to 65535" in out.stdout + out.stderr
    )
    assert "Error: mixed_precision: 'fp32' is not valid: expected one of no, fp16, bf16, fp8" in out.stdout + out.stderr
    saved = yaml.safe_load((tmp_path / "cfg" / "x" / "launch.yaml").read_text())
    assert saved["distributed_type"] == "MULTI_CPU"
    assert (saved["num_machines"], saved["machine_rank"], saved["main_process_ip"]) == (2, 1, "10.0.0.1")
    assert (saved["main_process_port"], saved["rdzv_backend"], saved["num_processes"]) == (29501, "c10d", 4)
    assert saved["mixed_precision"] == "bf16" and saved["use_cpu"] is True
    # Asked per machine, written as the whole job's count, as the launcher reads it.
    assert "How many processes on each machine?" in out.stdout


def test_several_machines_with_every_default_launches(run, tmp_path: Path, console_script) -> None:
    # The issue: these answers once wrote distributed_type NO, 2 machines and 1 process, which the
    # launcher refused ("num_processes 1 is not a multiple of num_machines 2").
    answers = ["several machines", "", "", "", "127.0.0.1", "", "", "", "", ""]
    out = run(answers, "--config_file", str(tmp_path / "two.yaml"))
    assert out.returncode == 0, out.stderr
    saved = yaml.safe_load((tmp_path / "two.yaml").read_text())
    assert (saved["distributed_type"], saved["num_machines"], saved["num_processes"]) == ("MULTI_CPU", 2, 2)
    (tmp_path / "train.py").write_text("pass\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_LAUNCH_", "X_CONFIG_FILE", "SLURM_"))}
    plan = subprocess.run(
        [console_script("x-launch"), "--config_file", str(tmp_path / "two.yaml"), "--dry-run", "train.py"],
        capture_output=True,
        text=True,
        env=clean,
        cwd=tmp_path,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stderr
    assert "--nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500" in plan.stdout


def test_input_that_ends_early_aborts_without_a_file(run, tmp_path: Path) -> None:
    out = run(["several machines", "MULTI_CPU", "3"], "--config_file", str(tmp_path / "never.yaml"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == "Aborted."
    assert "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "never.yaml").exists()


def test_fsdp_and_deepspeed_essentials_land_in_their_sections(run, tmp_path: Path) -> None:
    fsdp = ["", "FSDP", "2", "", "", "", "", "LlamaDecoderLayer", "", "yes", "no"]
    out = run(fsdp, "--config_file", str(tmp_path / "fsdp.yaml"))
    assert out.returncode == 0, out.stderr
    saved = yaml.safe_load((tmp_path / "fsdp.yaml").read_text())
    assert saved["fsdp_config"] == {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_offload_params": True,
        "fsdp_activation_checkpointing": False,
    }
    deepspeed = ["", "DEEPSPEED", "2", "", "", "3", "cpu", "cpu", "4", "0.5"]
    out = run(deepspeed, "--config_file", str(tmp_path / "ds.yaml"))
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load((tmp_path / "ds.yaml").read_text())["deepspeed_config"] == {
        "zero_stage": 3,
        "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu",
        "gradient_accumulation_steps": 4,
        "gradient_clipping": 0.5,
    }


def test_an_existing_file_is_kept_unless_the_user_agrees(run, tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("num_processes: 3\n")
    out = run(["n"], "--config_file", str(path))
    assert out.returncode == 1
    assert "Aborted." in out.stderr
    assert path.read_text() == "num_processes: 3\n"
    out = run(["y", *[""] * 6], "--config_file", str(path))
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(path.read_text())["num_processes"] == 1
    out = run([""] * 6, "--config_file", str(path), "--force")
    assert out.returncode == 0 and "exists" not in out.stdout
