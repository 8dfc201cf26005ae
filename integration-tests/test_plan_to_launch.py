"""x-estimate --plan --write-config writes a launch config that x-launch runs as it is.

The plan is made for a budget where only sharding fits (FSDP's SHARD_GRAD_OP, "zero2"), so the
file carries a strategy, not just a process count; x-launch then starts a real two-process run
from it on the CPU (``--cpu`` is the one thing given beside the file: the plan is for GPUs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from x_common.sizes import format_size

WORKERS = Path(__file__).parent / "workers"
MARGIN = 1 << 30  # x_estimate.plan.search.MARGIN: kept free on each GPU


def _tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _estimate(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("x-estimate"), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def planned(tmp_path_factory, launch_env) -> tuple[Path, dict, dict[str, str]]:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig

    root = tmp_path_factory.mktemp("plan")
    environ = launch_env(root)
    model = root / "llama"
    LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=8000).save_pretrained(model)  # fmt: skip
    common = ("--seq-len", "128", "--batch-size", "1")
    zero2 = _estimate(str(model), *common, "--dtypes", "bfloat16", "--precision", "mixed-bf16", "--device", "cuda",
                      "--num-gpus", "2", "--shard", "zero2", "--json", env=environ)  # fmt: skip
    assert zero2.returncode == 0, zero2.stderr
    reserved = json.loads(zero2.stdout)["rows"][0]["training"]["reserved_bytes"]
    config = root / "planned.yaml"
    args = (str(model), "--plan", *common, "--gpus", "2", "--gpu-memory", f"{MARGIN + reserved}B")
    done = _estimate(*args, "--write-config", str(config), "--json", env=environ)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["config_file"] == str(config)
    return config, plan, environ


def test_the_written_config_is_the_plans_first_row(planned) -> None:
    config, plan, _ = planned
    first = plan["rows"][0]
    assert (first["precision"], first["shard"], first["offload"], first["checkpointing"]) == (
        "mixed-bf16", "zero2", "none", False,
    )  # fmt: skip
    text = config.read_text()
    assert yaml.safe_load(text) == {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": 2,
        "use_cpu": False,
        "mixed_precision": "bf16",
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": False,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
            "fsdp_offload_params": False,
            "fsdp_activation_checkpointing": False,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        },
    }
    comments = [line for line in text.splitlines() if line.startswith("# ")]
    allocated, reserved = format_size(first["allocated"]), format_size(first["reserved"])
    assert any(
        line.startswith(f"# Simulated per GPU: allocated {allocated}, reserved {reserved}, ") for line in comments
    )
    assert "# In the script: DataLoader(batch_size=1): sequences per process per micro-batch." in comments
    assert f"# Run: x-launch --config_file {config} your_script.py" in comments


def test_accelerates_loader_reads_the_written_config(planned) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    theirs = load_config_from_file(str(planned[0]))
    assert (str(theirs.distributed_type), theirs.num_processes, theirs.mixed_precision) == (
        "DistributedType.FSDP", 2, "bf16",
    )  # fmt: skip
    assert theirs.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert theirs.fsdp_config["fsdp_reshard_after_forward"] is False


def test_x_launch_runs_the_written_config_as_it_is(planned, tmp_path) -> None:
    config, _plan, environ = planned
    dry = subprocess.run(
        [_tool("x-launch"), "--config_file", str(config), "--dry-run", str(WORKERS / "planned_run.py")],
        capture_output=True, text=True, env=environ, timeout=120,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "ignored" not in (dry.stdout + dry.stderr).lower()
    for line in ("X_DISTRIBUTED_TYPE=FSDP", "X_FSDP_RESHARD_AFTER_FORWARD=0", "X_MIXED_PRECISION=bf16"):
        assert line in dry.stdout, dry.stdout
    assert "--nproc-per-node 2" in dry.stdout
    run = subprocess.run(
        [_tool("x-launch"), "--config_file", str(config), "--cpu", str(WORKERS / "planned_run.py"), str(tmp_path)],
        capture_output=True, text=True, env=environ, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["type"] == "FSDP" and report["world"] == 2
    assert (report["mixed_precision"], report["accumulation"]) == ("bf16", 1)
    assert (report["reshard_after_forward"], report["activation_checkpointing"]) == (False, False)
    assert report["units"] and report["loss"] > 0
