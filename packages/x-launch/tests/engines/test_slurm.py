"""Inside a SLURM allocation: what x-launch derives from SLURM's variables, per situation.

The environments below are what SLURM 22.05 sets (seen on the local test cluster): the batch
script has SLURM_JOB_ID, SLURM_PROCID=0 and SLURM_NODEID=0 but no SLURM_STEP_ID; every srun
task also has SLURM_STEP_ID, SLURM_STEP_NODELIST and the step's SLURM_NNODES/SLURM_NTASKS.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from x_common import env
from x_launch.cli import main
from x_launch.config.file import ConfigError, load_config
from x_launch.config.launch_config import Setting
from x_launch.config.resolve import resolve
from x_launch.engines import slurm as slurm_plan
from x_launch.engines.plan import build_plan

PY = "/opt/py/bin/python"

# srun -N 2 --ntasks-per-node=1 x-launch ...  (seen from the task on the second node)
ONE_TASK_PER_NODE = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu-[01-02]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "gpu-[01-02]",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_GPUS_ON_NODE": "4",
}

# srun -N 2 -n 4 x-launch ...  (the fourth task: second task on the second node)
EVERY_TASK_A_RANK = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NODELIST": "cn[1-2]",
    "SLURM_STEP_ID": "3",
    "SLURM_STEP_NODELIST": "cn[1-2]",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}

# x-launch in an sbatch script on one node
BATCH_ONE_NODE = {
    "SLURM_JOB_ID": "5",
    "SLURM_JOB_NODELIST": "vm",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_TASKS_PER_NODE": "1",
}

# x-launch in an sbatch -N 2 script
BATCH_TWO_NODES = {**BATCH_ONE_NODE, "SLURM_JOB_ID": "6", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2"}
BATCH_TWO_NODES["SLURM_TASKS_PER_NODE"] = "1(x2)"


def plan_for(environ: dict[str, str], *args: str, config: Path | None = None, **kwargs):
    """build_plan for ``x-launch ARGS train.py`` in ``environ`` (flags parsed as the CLI does)."""
    flags: dict[str, str | bool] = {}
    items = list(args)
    while items:
        name = items.pop(0).lstrip("-")
        if name == "cpu":
            flags["use_cpu"] = True
        else:
            flags[name] = items.pop(0)
    settings = resolve(load_config(config) if config else None, flags, environ={})
    return build_plan(settings, ["train.py", "--epochs", "3"], python=PY, environ=environ, **kwargs)


def sources(plan) -> dict[str, tuple[object, str]]:
    keys = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")
    return {key: (plan.settings[key].value, plan.settings[key].source) for key in keys}


def error(environ: dict[str, str], *args: str, **kwargs) -> str:
    with pytest.raises(ConfigError) as excinfo:
        plan_for(environ, *args, **kwargs)
    return str(excinfo.value)


# --- outside SLURM: nothing changes -----------------------------------------------------------


def test_outside_slurm_the_plan_is_the_usual_one() -> None:
    plan = plan_for({}, "--num_processes", "2", "--cpu")
    assert plan.notes == []
    assert all(s.source != slurm_plan.SOURCE for s in plan.settings.values())
    assert "--nnodes 1 --nproc-per-node 2 --standalone" in " ".join(plan.argv)  # a free port, as always on one machine


# --- (a) srun with one task per node: torchrun on every node -------------------------------------


def test_one_task_per_node_runs_torchrun_with_slurms_layout() -> None:
    plan = plan_for(ONE_TASK_PER_NODE, "--num_processes", "8")
    assert plan.engine.name == "torchrun"
    assert plan.argv == [
        PY,
        "-m",
        "x_launch.run.torchrun_agent",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--node-rank",
        "1",
        "--master-addr",
        "gpu-01",
        "--master-port",
        "23456",
        "--max-restarts",
        "0",
        "--rdzv-conf",
        "timeout=600",
        "--log-dir",
        plan.scratch_logs,
        "--redirects",
        "2",
        "train.py",
        "--epochs",
        "3",
    ]
    assert sources(plan) == {
        "num_processes": (8, "--num_processes"),
        "num_machines": (2, "slurm"),
        "machine_rank": (1, "slurm"),
        "main_process_ip": ("gpu-01", "slurm"),
        "main_process_port": (23456, "slurm"),
    }
    assert plan.notes == ["slurm: job step with one task per node: torchrun on this node, static rendezvous"]


def test_one_task_per_node_defaults_to_the_gpus_slurm_gave_the_node() -> None:
    plan = plan_for(ONE_TASK_PER_NODE)
    assert plan.settings["num_processes"] == Setting(8, "slurm")
    assert "--nproc-per-node 4" in " ".join(plan.argv)


def test_one_task_per_node_on_cpu_defaults_to_one_process_per_node() -> None:
    plan = plan_for(ONE_TASK_PER_NODE, "--cpu")
    assert plan.settings["num_processes"] == Setting(2, "slurm")
    assert "--nnodes 2 --nproc-per-node 1 --node-rank 1" in " ".join(plan.argv)
    assert plan.env[env.DISTRIBUTED_TYPE.name] == "MULTI_CPU"


def test_one_task_on_one_node_runs_the_interpreter() -> None:
    step = {**ONE_TASK_PER_NODE, "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": "1"}
    step.update(SLURM_STEP_NODELIST="gpu-02", SLURM_TASKS_PER_NODE="1", SLURM_GPUS_ON_NODE="0")
    plan = plan_for(step)
    assert plan.engine.name == "python" and plan.argv == [PY, "train.py", "--epochs", "3"]
    assert plan.settings["num_processes"] == Setting(1, "slurm")


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("gpu-[01-03,07]", "gpu-01"),
        ("gpu-a[08-10],gpu-b12", "gpu-a08"),
        ("node[3-4],login1", "node3"),
        ("rack[1-2]-n[07-08]", "rack1-n07"),
        ("vm", "vm"),
    ],
)
def test_master_is_the_first_host_of_the_step(nodelist: str, first: str) -> None:
    step = {**ONE_TASK_PER_NODE, "SLURM_JOB_NODELIST": "login9,other[1-9]", "SLURM_STEP_NODELIST": nodelist}
    plan = plan_for(step, "--num_processes", "2")
    assert plan.settings["main_process_ip"] == Setting(first, "slurm")
    assert f"--master-addr {first} " in " ".join(plan.argv)


def test_without_a_step_nodelist_the_jobs_first_host_is_the_master() -> None:
    step = {k: v for k, v in ONE_TASK_PER_NODE.items() if k != "SLURM_STEP_NODELIST"}
    step["SLURM_JOB_NODELIST"] = "gpu-[01-03,07]"
    assert plan_for(step, "--num_processes", "2").settings["main_process_ip"] == Setting("gpu-01", "slurm")


def test_master_port_and_addr_variables_beat_the_job_id_port() -> None:
    plan = plan_for({**ONE_TASK_PER_NODE, "MASTER_PORT": "31000", "MASTER_ADDR": "10.0.0.9"})
    assert plan.settings["main_process_port"] == Setting(31000, "MASTER_PORT")
    assert plan.settings["main_process_ip"] == Setting("10.0.0.9", "MASTER_ADDR")
    assert "--master-addr 10.0.0.9 --master-port 31000" in " ".join(plan.argv)


def test_flags_beat_master_port_and_the_job_id() -> None:
    plan = plan_for(
        {**ONE_TASK_PER_NODE, "MASTER_PORT": "31000"}, "--main_process_port", "6000", "--main_process_ip", "ib-01"
    )
    assert plan.settings["main_process_port"] == Setting(6000, "--main_process_port")
    assert "--master-addr ib-01 --master-port 6000" in " ".join(plan.argv)


def test_slurm_replaces_a_config_files_machine_layout(tmp_path: Path) -> None:
    # Accelerate's files always say num_machines 1 and machine_rank 0; on an allocation SLURM knows better.
    cfg = tmp_path / "accelerate.yaml"
    cfg.write_text(
        "num_machines: 1\nmachine_rank: 0\nnum_processes: 4\nmain_process_ip: 10.9.9.9\nmain_process_port: 29500\n"
    )
    plan = plan_for(ONE_TASK_PER_NODE, config=cfg)
    assert sources(plan) == {
        "num_processes": (4, f"config file {cfg}"),
        "num_machines": (2, "slurm"),
        "machine_rank": (1, "slurm"),
        "main_process_ip": ("gpu-01", "slurm"),
        "main_process_port": (23456, "slurm"),
    }
    assert "--nproc-per-node 2" in " ".join(plan.argv)


def test_c10d_rendezvous_uses_the_slurm_master() -> None:
    plan = plan_for(ONE_TASK_PER_NODE, "--rdzv_backend", "c10d", "--num_processes", "2")
    assert "--rdzv-backend c10d --rdzv-endpoint gpu-01:23456 --rdzv-id x-slurm-123456" in " ".join(plan.argv)


# --- (b) srun with several tasks per node: every task is one rank --------------------------------


def test_every_task_is_one_rank_run_directly_with_torchs_variables() -> None:
    plan = plan_for(EVERY_TASK_A_RANK, "--cpu")
    assert plan.engine.name == "python"
    assert plan.argv == [PY, "train.py", "--epochs", "3"]
    ranks = {name: plan.env[name] for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    assert ranks == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    assert (plan.env["MASTER_ADDR"], plan.env["MASTER_PORT"]) == ("cn1", "20077")
    assert plan.env[env.DISTRIBUTED_TYPE.name] == "MULTI_CPU" and plan.env[env.LAUNCHED_BY_X.name] == "1"
    assert sources(plan) == {
        "num_processes": (4, "slurm"),
        "num_machines": (2, "slurm"),
        "machine_rank": (1, "slurm"),
        "main_process_ip": ("cn1", "slurm"),
        "main_process_port": (20077, "slurm"),
    }
    assert plan.notes == ["slurm: job step with several tasks per node: this task is one rank, run directly"]


def test_every_task_a_rank_reads_back_as_the_same_process_env() -> None:
    from x_common.process_env import process_env

    plan = plan_for(EVERY_TASK_A_RANK, "--num_processes", "4")
    seen = process_env({**EVERY_TASK_A_RANK, **plan.env})
    assert (seen.rank, seen.world_size, seen.local_rank, seen.local_world_size, seen.node_rank) == (3, 4, 1, 2, 1)
    assert (seen.master_addr, seen.master_port, seen.source) == ("cn1", 20077, "torchrun")


def test_uneven_tasks_per_node_are_fine_when_every_task_is_a_rank() -> None:
    step = {**EVERY_TASK_A_RANK, "SLURM_NTASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}
    step["SLURM_TASKS_PER_NODE"] = "2,1"
    plan = plan_for(step, "--num_processes", "3")
    assert (plan.env["RANK"], plan.env["WORLD_SIZE"], plan.env["LOCAL_WORLD_SIZE"]) == ("2", "3", "1")


def test_module_target_with_every_task_a_rank() -> None:
    settings = resolve(None, {}, environ={})
    plan = build_plan(settings, ["pkg.train", "--x"], module=True, python=PY, environ=EVERY_TASK_A_RANK)
    assert plan.argv == [PY, "-m", "pkg.train", "--x"]


# --- (c) x-launch in the batch script ----------------------------------------------------------


def test_batch_script_on_one_node_runs_torchrun_here() -> None:
    plan = plan_for(BATCH_ONE_NODE, "--num_processes", "2", "--cpu")
    assert plan.engine.name == "torchrun"
    assert (
        "-m x_launch.run.torchrun_agent --nnodes 1 --nproc-per-node 2 --node-rank 0 --master-addr vm --master-port 20005"
    ) in " ".join(plan.argv)
    assert plan.notes == ["slurm: batch script on a one-node allocation: torchrun here"]
    assert plan.settings["num_processes"] == Setting(2, "--num_processes")


def test_batch_script_with_tasks_is_still_the_batch_script() -> None:
    # sbatch -n 2 sets SLURM_NTASKS=2 in the batch script too; without a step id, it is not a task.
    plan = plan_for({**BATCH_ONE_NODE, "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2"}, "--num_processes", "2")
    assert plan.engine.name == "torchrun" and "RANK" not in plan.env


def test_batch_script_on_two_nodes_hands_over_to_srun_with_the_same_arguments(tmp_path: Path) -> None:
    cfg = tmp_path / "launch.yaml"
    cfg.write_text("mixed_precision: bf16\n")
    plan = plan_for(BATCH_TWO_NODES, "--num_processes", "4", "--cpu", config=cfg, log_dir="logs", tee=True)
    assert plan.engine.name == "srun"
    x_launch = shutil.which("x-launch", path=str(Path(PY).parent)) or "unexpected"
    assert x_launch == "unexpected"  # not installed beside PY: the fallback runs the CLI through the interpreter
    assert plan.argv == [
        "srun",
        "--nodes",
        "2",
        "--ntasks",
        "2",
        "--ntasks-per-node",
        "1",
        "--whole",
        "--kill-on-bad-exit=1",
        PY,
        "-c",
        "from x_launch.cli import main; main()",
        "--config_file",
        str(cfg),
        "--num_processes",
        "4",
        "--cpu",
        "--log_dir",
        "logs",
        "--tee",
        "train.py",
        "--epochs",
        "3",
    ]
    assert plan.env == {}
    assert plan.notes == ["slurm: allocation without a step: one x-launch per node through srun (each a job step)"]
    assert plan.settings["num_machines"] == Setting(2, "slurm")


def test_srun_hand_over_uses_the_console_script_beside_the_interpreter() -> None:
    settings = resolve(None, {"num_processes": "2"}, environ={})
    plan = build_plan(settings, ["t.py"], python=sys.executable, environ=BATCH_TWO_NODES)
    beside = shutil.which("x-launch", path=str(Path(sys.executable).parent))
    assert beside is not None
    assert plan.argv[9:] == [beside, "--num_processes", "2", "t.py"]


def test_salloc_shell_on_one_node_hands_over_to_srun() -> None:
    # salloc's shell has no SLURM_PROCID and may run on the login node: the job runs on the allocation.
    shell = {k: v for k, v in BATCH_ONE_NODE.items() if k not in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")}
    plan = plan_for(shell, "--num_processes", "2")
    assert plan.engine.name == "srun" and plan.argv[:3] == ["srun", "--nodes", "1"]


def test_the_x_launch_that_srun_starts_does_not_recurse() -> None:
    # What the inner x-launch sees on the second node: the batch environment plus srun's step variables.
    inner = {**BATCH_TWO_NODES, "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "2"}
    inner.update(SLURM_NODEID="1", SLURM_PROCID="1")
    plan = plan_for(inner, "--num_processes", "4", "--cpu")
    assert plan.engine.name == "torchrun"
    assert "--nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr node1 --master-port 20006" in " ".join(plan.argv)


def test_forwarded_args_leave_variables_to_srun() -> None:
    settings = resolve(
        None,
        {"num_processes": "4", "mixed_precision": "bf16", "dynamo_backend": "inductor"},
        environ={"X_LAUNCH_GRADIENT_ACCUMULATION_STEPS": "4"},
    )
    assert slurm_plan.forwarded_args(settings) == [
        "--num_processes",
        "4",
        "--mixed_precision",
        "bf16",
        "--dynamo_backend",
        "INDUCTOR",
    ]


# --- mismatches: one line, the fix -----------------------------------------------------------------


def test_num_machines_flag_disagreeing_with_slurm() -> None:
    assert error(ONE_TASK_PER_NODE, "--num_machines", "3") == (
        "num_machines 3 (from --num_machines) disagrees with SLURM: the step has 2 node(s) (SLURM_NNODES=2); "
        "drop it, or ask SLURM for --nodes=3"
    )
    assert error(BATCH_TWO_NODES, "--num_machines", "1") == (
        "num_machines 1 (from --num_machines) disagrees with SLURM: the job has 2 node(s) (SLURM_NNODES=2); "
        "drop it, or ask SLURM for --nodes=1"
    )


def test_machine_rank_flag_disagreeing_with_slurm() -> None:
    assert error(ONE_TASK_PER_NODE, "--machine_rank", "0") == (
        "machine_rank 0 (from --machine_rank) disagrees with SLURM: this is node 1 (SLURM_NODEID=1); "
        "drop it, SLURM numbers the nodes"
    )
    assert error(BATCH_TWO_NODES, "--machine_rank", "1") == (
        "machine_rank 1 (from --machine_rank) cannot hold for every node of a 2-node allocation: "
        "drop it, SLURM numbers the nodes (SLURM_NODEID)"
    )


def test_processes_that_do_not_split_over_the_nodes() -> None:
    assert error(ONE_TASK_PER_NODE, "--num_processes", "3") == (
        "num_processes 3 (from --num_processes) cannot be spread evenly over 2 nodes (SLURM_NNODES=2): "
        "use a multiple of 2"
    )
    assert "cannot be spread evenly over 2 nodes" in error(BATCH_TWO_NODES, "--num_processes", "5")


def test_more_processes_than_gpus_on_the_node() -> None:
    assert error(ONE_TASK_PER_NODE, "--num_processes", "16") == (
        "num_processes 16 (from --num_processes) means 8 process(es) on this node, but SLURM allocated 4 GPU(s) "
        "here (SLURM_GPUS_ON_NODE=4): ask SLURM for --gpus-per-node=8, use fewer, or pass --cpu"
    )
    assert plan_for(ONE_TASK_PER_NODE, "--num_processes", "16", "--cpu").settings["num_processes"].value == 16


def test_num_processes_disagreeing_with_srun_tasks() -> None:
    assert error(EVERY_TASK_A_RANK, "--num_processes", "8") == (
        "num_processes 8 (from --num_processes) disagrees with srun: it started 4 tasks (SLURM_NTASKS=4) and each "
        "task is one process; use srun -n 8, or srun --ntasks-per-node=1 to let x-launch start the processes on "
        "each node"
    )


def test_a_config_files_num_processes_counts_as_asked(tmp_path: Path) -> None:
    cfg = tmp_path / "launch.yaml"
    cfg.write_text("num_processes: 8\n")
    assert error(EVERY_TASK_A_RANK, config=cfg).startswith(
        f"num_processes 8 (from config file {cfg}) disagrees with srun: it started 4 tasks"
    )


def test_more_tasks_than_gpus_on_the_node() -> None:
    assert error({**EVERY_TASK_A_RANK, "SLURM_GPUS_ON_NODE": "1"}) == (
        "srun started 2 process(es) on this node, but SLURM allocated 1 GPU(s) here (SLURM_GPUS_ON_NODE=1): "
        "ask SLURM for --gpus-per-node=2, start fewer tasks per node, or pass --cpu"
    )


def test_torchrun_only_options_when_every_task_is_a_rank() -> None:
    assert error(EVERY_TASK_A_RANK, log_dir="logs") == (
        "--log_dir needs torchrun, which x-launch does not start when every srun task is one process: "
        "use srun --ntasks-per-node=1 (x-launch then starts the processes on each node)"
    )
    assert error(EVERY_TASK_A_RANK, "--max_restarts", "2").startswith("--max_restarts needs torchrun")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"SLURM_JOB_NODELIST": None, "SLURM_STEP_NODELIST": None},
            "SLURM_JOB_ID=123456 is set but SLURM_JOB_NODELIST is not: run x-launch inside the allocation "
            "(srun or the batch script), or unset SLURM_JOB_ID to launch outside SLURM",
        ),
        ({"SLURM_STEP_NODELIST": "gpu-[01-"}, "SLURM_STEP_NODELIST: invalid SLURM node list 'gpu-[01-'"),
        ({"SLURM_NNODES": "two"}, "SLURM_NNODES='two' is not valid"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is not below SLURM_NNODES=2: SLURM's variables disagree"),
    ],
)
def test_broken_slurm_variables_are_one_line(changes: dict[str, str | None], message: str) -> None:
    environ = {k: v for k, v in {**ONE_TASK_PER_NODE, **changes}.items() if v is not None}
    assert message in error(environ)


# --- through the command line: --dry-run shows the [slurm] sources --------------------------------


@pytest.fixture
def slurm_env(monkeypatch: pytest.MonkeyPatch):
    def enter(values: dict[str, str]) -> None:
        for var in env.FOREIGN:
            monkeypatch.delenv(var.name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return enter


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as excinfo:
        main([*args])
    out = capsys.readouterr()
    return int(excinfo.value.code or 0), out.out, out.err


def test_dry_run_in_a_step_shows_slurm_sources(slurm_env, capsys, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')")
    slurm_env(ONE_TASK_PER_NODE)
    code, out, err = dry_run(capsys, "--num_processes", "8", "--dry-run", str(script))
    assert code == 0, err
    for line in (
        "  num_machines: 2  [slurm]",
        "  num_processes: 8  [--num_processes]",
        "  machine_rank: 1  [slurm]",
        "  main_process_ip: gpu-01  [slurm]",
        "  main_process_port: 23456  [slurm]",
        "slurm: job step with one task per node: torchrun on this node, static rendezvous",
        "engine: torchrun",
    ):
        assert line in out.splitlines()
    assert "--nnodes 2 --nproc-per-node 4 --node-rank 1 --master-addr gpu-01 --master-port 23456" in out


def test_dry_run_with_every_task_a_rank_shows_the_rank_variables(slurm_env, capsys, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    slurm_env({**EVERY_TASK_A_RANK, "MASTER_PORT": "29999"})
    code, out, err = dry_run(capsys, "--cpu", "--dry-run", str(script))
    assert code == 0, err
    lines = out.splitlines()
    for line in (
        "  num_processes: 4  [slurm]",
        "  main_process_port: 29999  [MASTER_PORT]",
        "engine: python",
        "  RANK=3",
        "  WORLD_SIZE=4",
        "  LOCAL_RANK=1",
        "  LOCAL_WORLD_SIZE=2",
        "  MASTER_ADDR=cn1",
        "  MASTER_PORT=29999",
    ):
        assert line in lines


def test_dry_run_in_a_two_node_batch_script_shows_the_srun_command(slurm_env, capsys, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    slurm_env(BATCH_TWO_NODES)
    code, out, err = dry_run(capsys, "--num_processes", "4", "--cpu", "--dry-run", str(script))
    assert code == 0, err
    assert "engine: srun" in out
    assert "command: srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --whole --kill-on-bad-exit=1 " in out
    assert out.rstrip().endswith(f"--num_processes 4 --cpu {script}\nenvironment:")


def test_a_mismatch_through_the_cli_is_one_error_line_and_exit_2(slurm_env, capsys, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    slurm_env(EVERY_TASK_A_RANK)
    code, out, err = dry_run(capsys, "--num_processes", "2", "--dry-run", str(script))
    assert code == 2 and out == ""
    assert err == (
        "Error: num_processes 2 (from --num_processes) disagrees with srun: it started 4 tasks (SLURM_NTASKS=4) "
        "and each task is one process; use srun -n 2, or srun --ntasks-per-node=1 to let x-launch start the "
        "processes on each node\n"
    )
