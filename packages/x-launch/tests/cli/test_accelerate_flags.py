"""``x-launch`` speaks ``accelerate launch``: its flags, with Accelerate's meaning, or one-line refusals."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from x_launch.cli import main
from x_launch.cli.accelerate_flags import REFUSED, REFUSED_PREFIXES, refusal


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def launch(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def dry_run(capsys, *args: str) -> tuple[list[str], dict[str, str]]:
    code, out, err = launch(capsys, "--dry-run", *args)
    assert code == 0, err
    command = next(line for line in out.splitlines() if line.startswith("command: "))[len("command: ") :]
    lines = out.splitlines()
    start = lines.index("environment:")
    environment = dict(line.strip().split("=", 1) for line in lines[start + 1 :])
    return command.split(), environment


def test_a_cluster_script_written_for_accelerate_launch_runs_unchanged(capsys, script, monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    argv, environment = dry_run(
        capsys,
        "--multi_gpu",
        "--use_fsdp",
        "--num_machines", "2",
        "--num_processes", "8",
        "--machine_rank", "1",
        "--main_process_ip", "10.0.0.1",
        "--main_process_port", "29600",
        "--mixed_precision", "bf16",
        "--gpu_ids", "0,1,2,3",
        "--num_cpu_threads_per_process", "6",
        "--fsdp_version", "2",
        "--fsdp-reshard-after-forward", "false",
        "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
        "--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer,LlamaMLP",
        "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
        "--fsdp_cpu_ram_efficient_loading", "true",
        "--fsdp_sync_module_states", "true",
        "--fsdp_activation_checkpointing", "true",
        "--gradient_accumulation_steps", "4",
        "--dynamo_backend", "inductor",
        "--dynamo_mode", "max-autotune",
        "--dynamo_use_fullgraph",
        "--max_restarts", "2",
        "--monitor_interval", "5",
        "--rdzv_conf", "timeout=900",
        "--role", "trainer",
        "--same_network",
        "-q",
        "--debug",
        "--log_dir", "logs",
        "--tee", "3",
        script,
        "--epochs", "3",
    )  # fmt: skip
    assert argv[1:] == [
        "-m", "x_launch.run.torchrun_agent",
        "--nnodes", "2", "--nproc-per-node", "4",
        "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29600",
        "--max-restarts", "2", "--rdzv-conf", "timeout=900", "--role", "trainer", "--monitor-interval", "5.0",
        "--log-dir", "logs", "--tee", "3",
        script, "--epochs", "3",
    ]  # fmt: skip
    assert environment == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "OMP_NUM_THREADS": "6",
        "X_LAUNCHED": "1",
        "X_DISTRIBUTED_TYPE": "FSDP",
        "X_MIXED_PRECISION": "bf16",
        "X_USE_CPU": "0",
        "X_GRADIENT_ACCUMULATION_STEPS": "4",
        "X_DEBUG_MODE": "1",
        "X_DYNAMO_BACKEND": "inductor",
        "X_DYNAMO_MODE": "max-autotune",
        "X_DYNAMO_FULLGRAPH": "1",
        "X_FSDP_VERSION": "2",
        "X_FSDP_RESHARD_AFTER_FORWARD": "0",
        "X_FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
        "X_FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer,LlamaMLP",
        "X_FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
        "X_FSDP_CPU_RAM_EFFICIENT_LOADING": "1",
        "X_FSDP_SYNC_MODULE_STATES": "1",
        "X_FSDP_ACTIVATION_CHECKPOINTING": "1",
    }


def test_deepspeed_flags_travel_to_the_runtime(capsys, script) -> None:
    _, environment = dry_run(
        capsys,
        "--use_deepspeed",
        "--num_processes", "2",
        "--zero_stage", "3",
        "--offload_optimizer_device", "cpu",
        "--offload-param-device", "nvme",
        "--offload_param_nvme_path", "/nvme",
        "--gradient_clipping", "1.0",
        "--zero3_init_flag", "true",
        "--zero3_save_16bit_model", "true",
        "--deepspeed_multinode_launcher", "standard",
        script,
    )  # fmt: skip
    assert environment["X_DISTRIBUTED_TYPE"] == "DEEPSPEED"
    assert environment["X_DEEPSPEED_ZERO_STAGE"] == "3"
    assert environment["X_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    assert environment["X_DEEPSPEED_OFFLOAD_PARAM_DEVICE"] == "nvme"
    assert environment["X_DEEPSPEED_GRADIENT_CLIPPING"] == "1.0"
    assert environment["X_DEEPSPEED_ZERO3_INIT"] == "1"
    assert environment["X_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"] == "1"


def test_deepspeed_wins_over_fsdp_and_fsdp_over_multi_gpu_as_in_accelerate(capsys, script) -> None:
    assert (
        dry_run(capsys, "--multi_gpu", "--use_fsdp", "--num_processes", "2", script)[1]["X_DISTRIBUTED_TYPE"] == "FSDP"
    )
    _, both = dry_run(capsys, "--use_fsdp", "--use_deepspeed", "--num_processes", "2", script)
    assert both["X_DISTRIBUTED_TYPE"] == "DEEPSPEED"


def test_multi_gpu_on_cpu_is_the_multi_process_launch(capsys, script) -> None:
    argv, environment = dry_run(capsys, "--multi_gpu", "--num_processes", "2", "--cpu", script)
    assert "x_launch.run.torchrun_agent" in argv and argv[argv.index("--nproc-per-node") + 1] == "2"
    assert environment["X_DISTRIBUTED_TYPE"] == "MULTI_CPU"
    _, inferred = dry_run(capsys, "--multi-gpu", "--num_processes", "2", script)
    assert "X_DISTRIBUTED_TYPE" not in inferred  # the runtime picks GPUs when there are some, else CPU


def test_omp_threads_default_to_physical_cores_per_local_process(capsys, script, monkeypatch) -> None:
    from x_launch.engines import plan as launch_plan

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launch_plan, "_physical_cores", lambda: 16)
    assert dry_run(capsys, "--num_processes", "4", "--cpu", script)[1]["OMP_NUM_THREADS"] == "4"
    assert dry_run(capsys, "--num_processes", "1", "--cpu", script)[1]["OMP_NUM_THREADS"] == "16"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own value is left alone
    assert "OMP_NUM_THREADS" not in dry_run(capsys, "--num_processes", "4", "--cpu", script)[1]
    assert dry_run(capsys, "--num_cpu_threads_per_process", "2", "--cpu", script)[1]["OMP_NUM_THREADS"] == "2"


def test_gpu_ids_from_the_flag_and_the_config_file(capsys, script, tmp_path: Path) -> None:
    assert dry_run(capsys, "--gpu-ids", "1,3", script)[1]["CUDA_VISIBLE_DEVICES"] == "1,3"
    config = tmp_path / "launch.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ngpu_ids: 2,3\n")
    assert dry_run(capsys, "--config_file", str(config), script)[1]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "CUDA_VISIBLE_DEVICES" not in dry_run(capsys, script)[1]


def test_no_python_and_module(capsys, script) -> None:
    argv, _ = dry_run(capsys, "--no_python", "--num_processes", "2", "echo", "hello")
    assert argv[-3:] == ["--no-python", "echo", "hello"]
    assert dry_run(capsys, "--no-python", "echo", "hello")[0] == ["echo", "hello"]
    code, _, err = launch(capsys, "--dry-run", "-m", "--no_python", "pkg")
    assert code == 2 and err.strip() == "Error: --module and --no_python contradict each other: pick one"


def test_tee_takes_accelerates_value_or_none(capsys, script) -> None:
    argv, _ = dry_run(capsys, "--num_processes", "2", "--log_dir", "logs", "-t", "1", script)
    assert argv[argv.index("--tee") + 1] == "1"
    argv, _ = dry_run(capsys, "--num_processes", "2", "--log_dir", "logs", "--tee", script, "--tee", "2")
    assert argv[argv.index("--tee") + 1] == "3" and argv[-2:] == ["--tee", "2"]  # the script's own --tee is its own
    argv, _ = dry_run(capsys, "--num_processes", "2", "--log_dir", "logs", "--tee", "0", script)
    assert "--redirects" in argv and "--tee" not in argv[: argv.index(script)]
    code, _, err = launch(capsys, "--dry-run", "--tee=9", script)
    assert code == 2 and "--tee 9: expected 0, 1, 2, 3" in err


def test_tpu_downcast_bf16(capsys, script) -> None:
    _, environment = dry_run(capsys, "--tpu", "--mixed_precision", "bf16", "--downcast_bf16", script)
    assert environment["XLA_DOWNCAST_BF16"] == "1"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--use_megatron_lm"], "x-launch does not run Megatron-LM"),
        (["--megatron-lm-tp-degree", "2"], "x-launch does not run Megatron-LM"),
        (["--fp8_backend", "te"], "x-launch sets no FP8 recipe"),
        (["--enable_cpu_affinity"], "numactl or taskset"),
        (["--mpirun_hostfile", "hosts"], "mpirun"),
        (["--aws_access_key_id", "k"], "SageMaker"),
        (["--tpu_cluster"], "TPU pods"),
        (["--vm", "a"], "TPU pods"),
        (["--deepspeed_hostfile", "h"], "pdsh"),
        (["--deepspeed_multinode_launcher", "pdsh"], "pdsh"),
        (["--fsdp_activation_checkpointing_offload", "true"], "activations on the device"),
    ],
)
def test_refused_flags_are_one_line_exit_2(capsys, script, args: list[str], needle: str) -> None:
    code, out, err = launch(capsys, *args, script)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err
    assert err.startswith(f"Error: {args[0]}: ")


def test_megatron_stays_refused_and_points_at_tensor_parallelism(capsys, script) -> None:
    why = (
        "x-launch does not run Megatron-LM: use --parallelism_config_tp_size for tensor parallelism, --use_fsdp or "
        "--use_deepspeed to shard a large model"
    )
    for args in (["--use_megatron_lm"], ["--megatron_lm_tp_degree", "2"], ["--megatron-lm-pp-degree=2"]):
        assert launch(capsys, *args, script) == (2, "", f"Error: {args[0].partition('=')[0]}: {why}\n")


def test_parallelism_config_flags_are_options_not_refusals(capsys, script) -> None:
    assert refusal("--use_parallelism_config") is None and refusal("--parallelism-config-cp-size") is None
    assert not any("parallelism" in flag for flag in [*REFUSED, *REFUSED_PREFIXES])
    argv, environment = dry_run(
        capsys, "--num_processes", "2", "--cpu", "--use_parallelism_config", "--parallelism_config_dp_shard_size", "2",
        script, "--parallelism_config_tp_size", "3",
    )  # fmt: skip
    assert environment["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    assert argv[-3:] == [script, "--parallelism_config_tp_size", "3"]  # after the script: the script's own


def test_every_accelerate_launch_flag_is_supported_or_refused() -> None:
    accelerate_launch = pytest.importorskip("accelerate.commands.launch")
    from x_launch.cli.command_line import launch as command

    ours = {name for param in command.params for name in getattr(param, "opts", []) + param.secondary_opts}
    unknown = []
    for action in accelerate_launch.launch_command_parser()._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help"):
                continue
            if flag not in ours and refusal(flag) is None:
                unknown.append(flag)
    assert unknown == []
    assert all(reason for reason in [*REFUSED.values(), *REFUSED_PREFIXES.values()])


def test_two_processes_from_accelerates_command_line_form_one_world(console_script, tmp_path: Path) -> None:
    code = (
        "import torch.distributed as dist, os\n"
        "dist.init_process_group('gloo')\n"
        "print(f\"rank={dist.get_rank()} world={dist.get_world_size()} omp={os.environ['OMP_NUM_THREADS']}\")\n"
        "dist.destroy_process_group()\n"
    )
    (tmp_path / "world.py").write_text(code)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_", "OMP_"))}
    out = subprocess.run(
        [console_script("x-launch"), "--multi_gpu", "--num_processes", "2", "--main_process_port", "0", "world.py"],
        capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # The two ranks share one pipe: their lines may arrive glued together, so find each report.
    assert sorted(re.findall(r"rank=\d+ world=\d+ omp=\d+", out.stdout)) == [
        "rank=0 world=2 omp=" + str(max(_cores() // 2, 1)),
        "rank=1 world=2 omp=" + str(max(_cores() // 2, 1)),
    ]


def _cores() -> int:
    from x_launch.engines import plan as launch_plan

    return launch_plan._physical_cores()


def test_merge_weights_parser_is_accelerates() -> None:
    from x_launch import merge_command_parser

    args = merge_command_parser().parse_args(["in", "out", "--unsafe_serialization", "--remove_checkpoint_dir"])
    assert (args.checkpoint_directory, args.output_path) == ("in", "out")
    assert args.unsafe_serialization and args.remove_checkpoint_dir
    assert not merge_command_parser().parse_args(["in", "out"]).unsafe_serialization


def test_merge_weights_without_x_runtime_says_how_to_install(tmp_path: Path) -> None:
    blocker = tmp_path / "x_runtime.py"
    blocker.write_text("raise ImportError('blocked for the test')\n")
    out = subprocess.run(
        [sys.executable, "-c", "from x_launch.cli import main; main(['merge-weights', 'in', 'out'])"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "Error: merge-weights needs x-runtime, which reads and writes the checkpoint: pip install x-runtime"
    )


def test_merge_command_calls_x_runtime(monkeypatch) -> None:
    import types

    from x_launch import merge_command, merge_command_parser

    calls = []
    fake = types.ModuleType("x_runtime")
    fake.merge_fsdp_weights = lambda *a, **k: calls.append((a, k))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "x_runtime", fake)
    merge_command(merge_command_parser().parse_args(["ckpt", "out", "--unsafe_serialization"]))
    assert calls == [(("ckpt", "out"), {"safe_serialization": False, "remove_checkpoint_dir": False})]


def _planned_processes(flags: dict, gpus: int, environ: dict | None = None) -> tuple[int, str]:
    from x_launch.config.resolve import resolve
    from x_launch.engines.plan import build_plan

    settings = resolve(None, flags=flags, environ={})
    plan = build_plan(settings, ["train.py"], environ=environ or {}, gpu_capabilities=[(9, 0)] * gpus)
    return plan.settings.num_processes, plan.settings.source("num_processes")


def test_num_processes_defaults_to_one_per_visible_gpu_as_accelerate_launch() -> None:
    # accelerate launch --multi_gpu train.py on a 4-GPU node runs 4 processes; so does x-launch.
    assert _planned_processes({"multi_gpu": True}, gpus=4) == (4, "one per visible GPU (4)")
    assert _planned_processes({}, gpus=4)[0] == 4
    assert _planned_processes({"gpu_ids": "0,2"}, gpus=4)[0] == 2
    assert _planned_processes({}, gpus=4, environ={"CUDA_VISIBLE_DEVICES": "1,2,3"})[0] == 3
    # What the user set wins; no GPU, one GPU or --cpu: one process.
    assert _planned_processes({"num_processes": "3"}, gpus=4) == (3, "--num_processes")
    assert _planned_processes({}, gpus=1)[0] == 1
    assert _planned_processes({"multi_gpu": True}, gpus=0)[0] == 1
    assert _planned_processes({"use_cpu": True}, gpus=4)[0] == 1
