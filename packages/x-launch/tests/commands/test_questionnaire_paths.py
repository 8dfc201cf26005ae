"""Every way through ``x-launch config`` writes a file that ``x-launch --dry-run`` then accepts.

The questionnaire is driven as a user drives it: answers typed on its input (click's
``CliRunner``, so that torch is imported once for the whole walk, with the GPU count this
machine reports replaced where a branch needs GPUs). Each file it writes is then handed to the
real ``x-launch --config_file FILE --dry-run train.py`` in a child process, which must exit 0
and print the plan the answers describe: the engine, torchrun's layout, the variables.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from x_launch.cli import command_line as cli
from x_launch.config.launch_config import TABLE

ENTER = ""


@dataclass
class Plan:
    engine: str
    command: str
    env: dict[str, str]


@dataclass
class Path_:
    """One way through the questions: the answers, what the file holds, what the plan shows."""

    answers: list[str]
    saved: dict[str, Any]  # keys the file must hold (sections as "section.key"), with their values
    engine: str
    command: tuple[str, ...] = ()  # pieces of the engine command, in order
    env: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()  # keys the file must not hold
    gpus: int = 0
    capabilities: tuple[tuple[int, int], ...] = ()
    slurm: dict[str, str] | None = None  # SLURM's variables for the dry run
    errors: tuple[str, ...] = ()  # lines the questionnaire prints before asking again


TWO_NODE_STEP = {  # srun -N 2 --ntasks-per-node=1 x-launch ..., seen from the second node
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}
TWO_NODE_BATCH = {  # sbatch -N 2: x-launch hands over to srun
    "SLURM_JOB_ID": "4243",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}

STANDALONE = ("-m x_launch.run.torchrun_agent --nnodes 1", "--standalone")


def _flat(saved: dict[str, Any]) -> dict[str, Any]:
    return {
        **{k: v for k, v in saved.items() if not isinstance(v, dict)},
        **{f"{s}.{k}": v for s, sub in saved.items() if isinstance(sub, dict) for k, v in sub.items()},
    }


PATHS: dict[str, Path_] = {
    # --- this machine -------------------------------------------------------------------------
    "this-defaults": Path_(
        [ENTER] * 4,
        {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": "NO",
            "num_machines": 1,
            "num_processes": 1,
            "use_cpu": True,
            "mixed_precision": "no",
        },
        "python",
        env={"X_DISTRIBUTED_TYPE": "NO", "X_USE_CPU": "1"},
        absent=("dynamo_config.dynamo_backend", "gpu_ids"),
    ),
    "this-multi-cpu": Path_(
        ["this machine", "multi_cpu", "4", "fp16", "inductor", "max-autotune"],
        {
            "distributed_type": "MULTI_CPU",
            "num_processes": 4,
            "mixed_precision": "fp16",
            "dynamo_config.dynamo_backend": "INDUCTOR",
            "dynamo_config.dynamo_mode": "max-autotune",
        },
        "torchrun",
        ("--nproc-per-node 4", *STANDALONE[1:]),
        {"X_MIXED_PRECISION": "fp16", "X_DYNAMO_BACKEND": "inductor", "X_DYNAMO_MODE": "max-autotune"},
    ),
    "this-multi-gpu-no-gpu-here": Path_(
        ["", "MULTI_GPU", "", "bf16", "EAGER", "reduce-overhead"],
        {
            "distributed_type": "MULTI_GPU",
            "num_processes": 2,
            "mixed_precision": "bf16",
            "use_cpu": True,
            "dynamo_config.dynamo_backend": "EAGER",
            "dynamo_config.dynamo_mode": "reduce-overhead",
        },
        "torchrun",
        (STANDALONE[0], "--nproc-per-node 2", STANDALONE[1]),
        {"X_DISTRIBUTED_TYPE": "MULTI_GPU", "X_MIXED_PRECISION": "bf16", "X_DYNAMO_BACKEND": "eager"},
    ),
    "this-multi-xpu": Path_(
        ["", "MULTI_XPU", "3", "fp8", "AOT_EAGER", ""],
        {
            "distributed_type": "MULTI_XPU",
            "num_processes": 3,
            "mixed_precision": "fp8",
            "dynamo_config.dynamo_backend": "AOT_EAGER",
            "dynamo_config.dynamo_mode": "default",
        },
        "torchrun",
        ("--nproc-per-node 3",),
        {"X_DISTRIBUTED_TYPE": "MULTI_XPU", "X_MIXED_PRECISION": "fp8", "X_DYNAMO_MODE": "default"},
    ),
    "this-fsdp-defaults": Path_(
        ["", "FSDP", *[ENTER] * 9],
        {
            "distributed_type": "FSDP",
            "num_processes": 2,
            "fsdp_config.fsdp_version": 2,
            "fsdp_config.fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_config.fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_config.fsdp_offload_params": False,
            "fsdp_config.fsdp_activation_checkpointing": False,
        },
        "torchrun",
        ("--nproc-per-node 2",),
        {"X_DISTRIBUTED_TYPE": "FSDP", "X_FSDP_VERSION": "2", "X_FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"},
        # As Accelerate: no answer means the model's _no_split_modules, not an empty list.
        absent=("fsdp_config.fsdp_transformer_layer_cls_to_wrap",),
    ),
    "this-fsdp1-size-based": Path_(
        ["", "FSDP", "2", "", "", "1", "size_based_wrap", "1000", "FULL_STATE_DICT", "yes", "yes"],
        {
            "fsdp_config.fsdp_version": 1,
            "fsdp_config.fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
            "fsdp_config.fsdp_min_num_params": 1000,
            "fsdp_config.fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_config.fsdp_offload_params": True,
            "fsdp_config.fsdp_activation_checkpointing": True,
        },
        "torchrun",
        ("--nproc-per-node 2",),
        {"X_FSDP_VERSION": "1", "X_FSDP_MIN_NUM_PARAMS": "1000", "X_FSDP_OFFLOAD_PARAMS": "1"},
    ),
    "this-fsdp-no-wrap": Path_(
        ["", "FSDP", "", "", "", "", "NO_WRAP", "LOCAL_STATE_DICT", "", ""],
        {"fsdp_config.fsdp_auto_wrap_policy": "NO_WRAP", "fsdp_config.fsdp_state_dict_type": "LOCAL_STATE_DICT"},
        "torchrun",
        env={"X_FSDP_AUTO_WRAP_POLICY": "NO_WRAP", "X_FSDP_STATE_DICT_TYPE": "LOCAL_STATE_DICT"},
        absent=("fsdp_config.fsdp_transformer_layer_cls_to_wrap", "fsdp_config.fsdp_min_num_params"),
    ),
    "this-fsdp-layer-classes": Path_(
        ["", "FSDP", "", "", "CUDAGRAPHS", "", "", "", "LlamaDecoderLayer,LlamaMLP", "", "", ""],
        {
            "fsdp_config.fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer,LlamaMLP",
            "dynamo_config.dynamo_backend": "CUDAGRAPHS",
        },
        "torchrun",
        env={"X_FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer,LlamaMLP", "X_DYNAMO_BACKEND": "cudagraphs"},
    ),
    "this-deepspeed-defaults": Path_(
        ["", "DEEPSPEED", *[ENTER] * 7],
        {
            "distributed_type": "DEEPSPEED",
            "deepspeed_config.zero_stage": 2,
            "deepspeed_config.offload_optimizer_device": "none",
            "deepspeed_config.gradient_accumulation_steps": 1,
            "deepspeed_config.gradient_clipping": 1.0,
        },
        "torchrun",
        ("--nproc-per-node 2",),
        {"X_DISTRIBUTED_TYPE": "DEEPSPEED", "X_DEEPSPEED_ZERO_STAGE": "2"},
        absent=("deepspeed_config.offload_param_device",),
    ),
    "this-deepspeed-zero3-cpu": Path_(
        ["", "DEEPSPEED", "2", "", "ONNXRT", "", "3", "cpu", "cpu", "4", "0.5"],
        {
            "deepspeed_config.zero_stage": 3,
            "deepspeed_config.offload_optimizer_device": "cpu",
            "deepspeed_config.offload_param_device": "cpu",
            "deepspeed_config.gradient_accumulation_steps": 4,
            "deepspeed_config.gradient_clipping": 0.5,
            "dynamo_config.dynamo_backend": "ONNXRT",
        },
        "torchrun",
        env={"X_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu", "X_DEEPSPEED_GRADIENT_CLIPPING": "0.5"},
    ),
    "this-deepspeed-zero3-nvme": Path_(
        ["", "DEEPSPEED", "", "", "OPENXLA", "", "3", "nvme", "", "nvme", "/scratch/nvme", "", ""],
        {
            "deepspeed_config.offload_optimizer_device": "nvme",
            "deepspeed_config.offload_optimizer_nvme_path": "/nvme",
            "deepspeed_config.offload_param_device": "nvme",
            "deepspeed_config.offload_param_nvme_path": "/scratch/nvme",
            "dynamo_config.dynamo_backend": "OPENXLA",
        },
        "torchrun",
        env={"X_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "nvme"},
    ),
    "this-deepspeed-zero1-asks-no-offload": Path_(
        ["", "DEEPSPEED", "", "", "TENSORRT", "", "1", "", ""],
        {"deepspeed_config.zero_stage": 1, "dynamo_config.dynamo_backend": "TENSORRT"},
        "torchrun",
        env={"X_DEEPSPEED_ZERO_STAGE": "1"},
        absent=("deepspeed_config.offload_optimizer_device", "deepspeed_config.offload_param_device"),
    ),
    "this-deepspeed-zero0": Path_(
        ["", "DEEPSPEED", "", "", "TVM", "max-autotune-no-cudagraphs", "0", "", ""],
        {
            "deepspeed_config.zero_stage": 0,
            "dynamo_config.dynamo_backend": "TVM",
            "dynamo_config.dynamo_mode": "max-autotune-no-cudagraphs",
        },
        "torchrun",
        env={"X_DEEPSPEED_ZERO_STAGE": "0"},
    ),
    "this-tpu-bf16": Path_(
        ["", "XLA", "train", "bf16", "yes", "IPEX", ""],
        {
            "distributed_type": "XLA",
            "use_cpu": False,
            "main_training_function": "train",
            "downcast_bf16": True,
            "dynamo_config.dynamo_backend": "IPEX",
        },
        "torch_xla",
        ("-m x_launch.run.xla_spawn --main_training_function train",),
        {"X_DISTRIBUTED_TYPE": "XLA", "XLA_DOWNCAST_BF16": "1", "PJRT_DEVICE": "TPU"},
        absent=("num_processes",),  # torch_xla starts one process per TPU device
    ),
    "this-tpu-defaults": Path_(
        ["", "XLA", "", "", ""],
        {"distributed_type": "XLA", "use_cpu": False, "main_training_function": "main"},
        "torch_xla",
        env={"X_MIXED_PRECISION": "no"},
        absent=("num_processes", "downcast_bf16"),
    ),
    # --- this machine, with GPUs ----------------------------------------------------------------
    "gpus-defaults": Path_(
        [ENTER] * 6,
        {"distributed_type": "MULTI_GPU", "gpu_ids": "all", "num_processes": 4, "use_cpu": False},
        "torchrun",
        ("--nproc-per-node 4",),
        {"X_USE_CPU": "0"},
        gpus=4,
        capabilities=((9, 0),) * 4,
    ),
    "gpus-fewer-visible-and-old-gpus": Path_(
        ["", "", "0,1", "3", "2", "bf16", "fp16", ""],
        {"gpu_ids": "0,1", "num_processes": 2, "mixed_precision": "fp16"},
        "torchrun",
        ("--nproc-per-node 2",),
        {"CUDA_VISIBLE_DEVICES": "0,1", "X_MIXED_PRECISION": "fp16"},
        gpus=4,
        capabilities=((7, 0),) * 4,
        errors=(
            "Error: 3 GPU processes on this machine, but 2 GPUs are visible: use at most 2 per machine "
            "(one per GPU), or --cpu",
            "Error: mixed_precision bf16 needs GPUs of compute capability 8.0 or newer (Ampere+); these have 7.0: "
            "use fp16, or --cpu",
        ),
    ),
    "one-gpu-defaults": Path_(
        [ENTER] * 5,
        {"distributed_type": "NO", "num_processes": 1, "use_cpu": False, "gpu_ids": "all"},
        "python",
        env={"X_USE_CPU": "0"},
        gpus=1,
    ),
    "gpus-multi-cpu-asks-no-gpu-ids": Path_(
        ["", "MULTI_CPU", "", "", ""],
        {"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True},
        "torchrun",
        ("--nproc-per-node 2",),
        absent=("gpu_ids",),
        gpus=2,
    ),
    # --- several machines -----------------------------------------------------------------------
    "several-defaults": Path_(
        ["several machines", ENTER, ENTER, ENTER, "127.0.0.1", *[ENTER] * 5],
        {
            "distributed_type": "MULTI_CPU",
            "num_machines": 2,
            "machine_rank": 0,
            "main_process_ip": "127.0.0.1",
            "main_process_port": 29500,
            "rdzv_backend": "static",
            "num_processes": 2,
        },
        "torchrun",
        ("--nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500",),
        {"X_DISTRIBUTED_TYPE": "MULTI_CPU"},
    ),
    "several-rank-2-of-3-c10d": Path_(
        ["several machines", "MULTI_CPU", "3", "2", "10.0.0.7", "29501", "c10d", "4", "bf16", ""],
        {"num_machines": 3, "machine_rank": 2, "num_processes": 12, "rdzv_backend": "c10d"},
        "torchrun",
        ("--nnodes 3 --nproc-per-node 4", "--rdzv-backend c10d --rdzv-endpoint 10.0.0.7:29501"),
        {"X_MIXED_PRECISION": "bf16"},
    ),
    "several-fsdp-rank-1": Path_(
        ["several machines", "FSDP", "4", "1", "10.0.0.7", "29502", "", "2", *[ENTER] * 8],
        {"distributed_type": "FSDP", "num_machines": 4, "machine_rank": 1, "num_processes": 8},
        "torchrun",
        ("--nnodes 4 --nproc-per-node 2 --node-rank 1 --master-addr 10.0.0.7 --master-port 29502",),
        {"X_DISTRIBUTED_TYPE": "FSDP"},
    ),
    "several-deepspeed-rank-1": Path_(
        ["several machines", "DEEPSPEED", "2", "1", "localhost", "29503", "", "3", "fp16", "", "3", "", "", "", ""],
        {
            "distributed_type": "DEEPSPEED",
            "main_process_ip": "localhost",
            "num_processes": 6,
            "deepspeed_config.zero_stage": 3,
            "deepspeed_config.offload_param_device": "none",
        },
        "torchrun",
        ("--nnodes 2 --nproc-per-node 3 --node-rank 1 --master-addr localhost",),
        {"X_DISTRIBUTED_TYPE": "DEEPSPEED", "X_DEEPSPEED_ZERO_STAGE": "3"},
    ),
    "several-gpus": Path_(
        ["several machines", "", "", "1", "10.0.0.7", "", "", "", "", "", ""],
        {"distributed_type": "MULTI_GPU", "gpu_ids": "all", "num_processes": 16, "use_cpu": False},
        "torchrun",
        ("--nnodes 2 --nproc-per-node 8 --node-rank 1",),
        gpus=8,
    ),
    "several-huge-count-of-machines": Path_(
        ["several machines", "", "100000000000000000000", "99999999999999999999", "10.0.0.7", "", "", "", "", ""],
        {"num_machines": 10**20, "machine_rank": 10**20 - 1, "num_processes": 10**20},
        "torchrun",
        ("--nnodes 100000000000000000000 --nproc-per-node 1 --node-rank 99999999999999999999",),
    ),
    # --- SLURM: the allocation decides machines, ranks, address and processes -------------------
    "slurm-defaults-outside-an-allocation": Path_(
        ["slurm", *[ENTER] * 3],
        {"compute_environment": "SLURM", "distributed_type": "MULTI_CPU", "use_cpu": True},
        "python",
        absent=("num_processes", "num_machines", "machine_rank", "main_process_ip"),
    ),
    "slurm-defaults-in-a-two-node-step": Path_(
        ["slurm", *[ENTER] * 3],
        {"compute_environment": "SLURM"},
        "torchrun",
        ("--nnodes 2 --nproc-per-node 1 --node-rank 1 --master-addr node1",),
        slurm=TWO_NODE_STEP,
    ),
    "slurm-fsdp-in-a-batch-script": Path_(
        ["slurm", "FSDP", "", "", *[ENTER] * 6],
        {"distributed_type": "FSDP"},
        "srun",
        ("srun --nodes 2 --ntasks 2 --ntasks-per-node 1",),
        slurm=TWO_NODE_BATCH,
    ),
    "slurm-deepspeed-gpus": Path_(
        ["slurm", "", "", "", "", "", "", ""],
        {"distributed_type": "DEEPSPEED", "use_cpu": False},
        "python",
        absent=("gpu_ids", "num_processes"),
        gpus=2,
    ),
}
PATHS["slurm-deepspeed-gpus"].answers[1] = "DEEPSPEED"

# Bad answers on the way, each refused with its reason and asked again; then a valid file.
PATHS["several-every-bad-answer"] = Path_(
    [
        "nowhere",
        "several machines",
        "GPU",
        "NO",
        "XLA",
        "multi_cpu",
        "0",
        "-1",
        "two",
        "1.5",
        "9" * 5000,
        "1",
        "2",
        "2",
        "-1",
        "1",
        "",
        "no-such-host.invalid",
        "10.0.0.7",
        "0",
        "65536",
        "http",
        "29504",
        "etcd",
        "c10d",
        "0",
        "1000",
        "2",
        "fp32",
        "bf16",
        "jit",
        "",
    ],
    {"num_machines": 2, "machine_rank": 1, "main_process_port": 29504, "num_processes": 4, "mixed_precision": "bf16"},
    "torchrun",
    ("--nnodes 2 --nproc-per-node 2", "--rdzv-endpoint 10.0.0.7:29504"),
    errors=(
        "Error: 'nowhere' is not one of 'this machine', 'several machines', 'slurm'.",
        "Error: distributed_type: 'GPU' is not valid: expected one of NO, MULTI_CPU, MULTI_GPU, MULTI_XPU, FSDP, "
        "DEEPSPEED, XLA",
        "Error: distributed_type NO runs one process; across several machines choose one of MULTI_CPU, MULTI_GPU, "
        "MULTI_XPU, FSDP, DEEPSPEED",
        "Error: distributed_type XLA runs on one TPU host (x-launch --tpu on each host); across several machines "
        "choose one of MULTI_CPU, MULTI_GPU, MULTI_XPU, FSDP, DEEPSPEED",
        "Error: num_machines: '0' is not valid: expected an integer >= 1",
        "Error: num_machines: '-1' is not valid: expected an integer >= 1",
        "Error: num_machines: 'two' is not valid: expected an integer >= 1",
        "Error: num_machines: '1.5' is not valid: expected an integer >= 1",
        "Error: num_machines: '99999",
        "Error: num_machines: several machines means 2 or more; for one, answer 'this machine' to the first question",
        "Error: machine_rank 2 must be below num_machines 2 (ranks start at 0)",
        "Error: machine_rank: '-1' is not valid: expected an integer >= 0",
        "Error: main_process_ip: an answer is needed: an IP address or host name",
        "Error: --main_process_ip no-such-host.invalid does not resolve",
        "Error: main_process_port 0 (a free port) works on one machine only; give every machine the same port, "
        "e.g. 29500",
        "Error: main_process_port: '65536' is not valid: expected an integer from 0 to 65535",
        "Error: main_process_port: 'http' is not valid: expected an integer from 0 to 65535",
        "Error: rdzv_backend: 'etcd' is not valid: expected one of static, c10d",
        "Error: num_processes: '0' is not valid: expected an integer >= 1",
        "Error: 1000 CPU processes on this machine is more than it can run well",
        "Error: mixed_precision: 'fp32' is not valid: expected one of no, fp16, bf16, fp8",
        "Error: dynamo_config.dynamo_backend: 'jit' is not valid: expected one of NO, EAGER,",
    ),
)
PATHS["slurm-refuses-one-process-and-tpu"] = Path_(
    ["slurm", "NO", "XLA", "MULTI_GPU", "", ""],
    {"distributed_type": "MULTI_GPU"},
    "python",
    errors=(
        "Error: distributed_type NO runs one process; across SLURM nodes choose one of",
        "Error: distributed_type XLA runs on one TPU host (x-launch --tpu on each host); across SLURM nodes",
    ),
)


def _answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Path_) -> tuple[str, Path]:
    """Run ``x-launch config --config_file FILE`` with the path's answers typed on its input."""
    import x_common.devices

    monkeypatch.setattr(x_common.devices, "device_count", lambda backend: path.gpus if backend == "cuda" else 1)
    monkeypatch.setattr(x_common.devices, "nvml_compute_capabilities", lambda: list(path.capabilities))
    target = tmp_path / "launch.yaml"
    result = CliRunner().invoke(
        cli._cli, ["config", "--config_file", str(target)], input="\n".join(path.answers) + "\n"
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith(f"wrote {target}"), result.output[-2000:]
    return result.output, target


def _dry_run(exe: str, tmp_path: Path, config: Path, slurm: dict[str, str] | None) -> Plan:
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("X_LAUNCH_", "X_CONFIG_FILE", "SLURM_", "MASTER_"))
    }
    environ.update(CUDA_VISIBLE_DEVICES="", **(slurm or {}))
    out = subprocess.run(
        [exe, "--config_file", str(config), "--dry-run", str(script)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, f"{config.read_text()}\n{out.stderr}"
    assert "Traceback" not in out.stdout + out.stderr
    lines = out.stdout.splitlines()
    engine = next(line.removeprefix("engine: ") for line in lines if line.startswith("engine: "))
    command = next(line.removeprefix("command: ") for line in lines if line.startswith("command: "))
    env_lines = lines[lines.index("environment:") + 1 :]
    env = dict(line.strip().split("=", 1) for line in env_lines)
    assert command.endswith(str(script)), command
    return Plan(engine, command, env)


@pytest.mark.parametrize("name", list(PATHS))
def test_every_answer_path_writes_a_config_the_launcher_accepts(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, console_script
) -> None:
    path = PATHS[name]
    output, config = _answer(tmp_path, monkeypatch, path)
    assert "Traceback" not in output
    for line in path.errors:
        assert line in output, f"missing {line!r} in:\n{output}"
    assert output.count("Error:") == len(path.errors), output
    saved = _flat(yaml.safe_load(config.read_text()))
    assert {key: saved.get(key) for key in path.saved} == path.saved
    assert not set(path.absent) & set(saved), saved
    plan = _dry_run(console_script("x-launch"), tmp_path, config, path.slurm)
    assert plan.engine == path.engine, plan
    position = 0
    for piece in path.command:
        found = plan.command.find(piece, position)
        assert found >= 0, f"{piece!r} not in order in {plan.command}"
        position = found + len(piece)
    assert {key: plan.env.get(key) for key in path.env} == path.env


def _answered(key: str) -> set[Any]:
    return {path.saved[key] for path in PATHS.values() if key in path.saved}


# Each question with a fixed set of answers, and that set.
CHOICE_QUESTIONS = {
    row.key: set(row.choices)
    for row in TABLE
    if row.key
    in (
        "compute_environment",
        "distributed_type",
        "mixed_precision",
        "rdzv_backend",
        "dynamo_config.dynamo_mode",
        "fsdp_config.fsdp_auto_wrap_policy",
        "fsdp_config.fsdp_state_dict_type",
        "deepspeed_config.offload_optimizer_device",
        "deepspeed_config.offload_param_device",
    )
}
CHOICE_QUESTIONS.update(
    {
        # NO is not written: the file holds a backend only when one is asked for.
        "dynamo_config.dynamo_backend": {b for b in next(r for r in TABLE if r.flag == "dynamo_backend").choices}
        - {"NO"},
        "fsdp_config.fsdp_version": {1, 2},
        "deepspeed_config.zero_stage": {0, 1, 2, 3},
        "fsdp_config.fsdp_offload_params": {True, False},
        "fsdp_config.fsdp_activation_checkpointing": {True, False},
        "use_cpu": {True, False},
    }
)


@pytest.mark.parametrize("key", sorted(CHOICE_QUESTIONS))
def test_the_walk_takes_every_choice_of_every_question(key: str) -> None:
    assert CHOICE_QUESTIONS[key], key
    missing = CHOICE_QUESTIONS[key] - _answered(key)
    assert not missing, f"no path answers {key} with {sorted(map(str, missing))}"


def test_the_walk_goes_everywhere_the_first_question_leads() -> None:
    machines = {path.saved.get("num_machines", 1) > 1 for path in PATHS.values()}
    where = _answered("compute_environment")
    assert machines == {True, False} and where == {"LOCAL_MACHINE", "SLURM"}
    ranks = {path.saved["machine_rank"] > 0 for path in PATHS.values() if "machine_rank" in path.saved}
    assert ranks == {True, False}
