"""Elastic node counts: ``--num_machines MIN:MAX`` (torchrun's ``--nnodes`` spelling) and its checks.

The plan is read as the command and environment x-launch would run; the real thing, three
network-namespace hosts of which one is lost mid-epoch, is ``integration-tests/test_elastic.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from x_common import env
from x_launch.config.file import ConfigError, load_config
from x_launch.config.resolve import ELASTIC_RESTARTS, resolve
from x_launch.engines.plan import build_plan

PY = "/opt/py/bin/python"
SLURM_NODE = {  # srun -N 3 --ntasks-per-node=1 x-launch ... (seen from the second node)
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "cn[1-3]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "cn[1-3]",
    "SLURM_NNODES": "3",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "3",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_TASKS_PER_NODE": "1(x3)",
}
MACHINE = ("--main_process_ip", "127.0.0.1", "--main_process_port", "29411", "--cpu")


def plan(*args: str, environ: dict[str, str] | None = None, flag_env: dict[str, str] | None = None, config=None):
    flags: dict[str, object] = {}
    items = list(args)
    while items:
        name = items.pop(0).lstrip("-")
        flags[name if name != "cpu" else "use_cpu"] = True if name == "cpu" else items.pop(0)
    settings = resolve(load_config(config) if config else None, flags, environ=flag_env or {})
    return build_plan(settings, ["train.py"], python=PY, environ=environ or {})


def refused(*args: str, **kwargs) -> str:
    with pytest.raises(ConfigError) as excinfo:
        plan(*args, **kwargs)
    return str(excinfo.value)


def test_a_range_makes_torchrun_elastic_with_c10d_and_restarts() -> None:
    got = plan("--num_machines", "2:3", "--num_processes", "6", *MACHINE)
    command = " ".join(got.argv)
    assert command.startswith(f"{PY} -m x_launch.run.torchrun_agent --nnodes 2:3 --nproc-per-node 2 ")
    assert "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29411 --rdzv-id x-29411 --local-addr 127.0.0.1" in command
    assert f"--max-restarts {ELASTIC_RESTARTS} " in command and "--rdzv-conf join_timeout=600 " in command
    # each rendezvous round gets a fresh worker store (see launch_plan)
    assert got.env[env.TORCH_NO_SHARED_RDZV_STORE.name] == "1"
    shown = {key: (got.settings[key].value, got.settings[key].source) for key in ("min_machines", "num_machines")}
    assert shown == {"min_machines": (2, "--num_machines 2:3"), "num_machines": (3, "--num_machines 2:3")}
    assert got.settings["rdzv_backend"].source == "elastic default (--num_machines 2:3)"


@pytest.mark.parametrize(
    "args",
    [("--min_machines", "2", "--num_machines", "3"), ("--min_machines", "2", "--max_machines", "3")],
    ids=["min-and-num", "min-and-max"],
)
def test_min_and_max_flags_say_the_same(args) -> None:
    got = plan(*args, "--num_processes", "3", *MACHINE)
    assert "--nnodes 2:3 --nproc-per-node 1 " in " ".join(got.argv)


def test_the_range_from_the_environment_and_from_a_config_file(tmp_path: Path) -> None:
    got = plan("--num_processes", "4", *MACHINE, flag_env={env.launch_flag_var("num_machines"): "1:2"})
    assert "--nnodes 1:2 --nproc-per-node 2 " in " ".join(got.argv)
    config = tmp_path / "elastic.yaml"
    config.write_text("num_machines: 4\nmin_machines: 2\nnum_processes: 4\nmax_restarts: 1\n")
    got = plan(*MACHINE, config=config)
    assert "--nnodes 2:4 --nproc-per-node 1 " in " ".join(got.argv) and "--max-restarts 1 " in " ".join(got.argv)


def test_an_explicit_restart_count_is_kept() -> None:
    assert "--max-restarts 0 " in " ".join(
        plan("--num_machines", "2:3", "--num_processes", "3", "--max_restarts", "0", *MACHINE).argv
    )


def test_min_equal_to_max_is_a_fixed_count() -> None:
    got = plan("--num_machines", "2:2", "--num_processes", "2", *MACHINE)
    assert "--nnodes 2 " in " ".join(got.argv) and env.TORCH_NO_SHARED_RDZV_STORE.name not in got.env


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--num_machines", "3:2"), "min_machines 3 (--num_machines 3:2) is above the most machines, 2"),
        (("--num_machines", "2:x"), "--num_machines: '2:x' is not valid: expected N, or MIN:MAX"),
        (("--num_machines", "2:3", "--min_machines", "1"), "--num_machines 2:3 and --min_machines both set"),
        (("--num_machines", "2", "--max_machines", "3"), "num_machines 2 (--num_machines) and max_machines 3"),
        (
            ("--num_machines", "2:3", "--rdzv_backend", "static"),
            "needs the c10d rendezvous, but rdzv_backend is static",
        ),
        (("--num_machines", "2:4", "--num_processes", "6"), "num_processes 6 is not a multiple of num_machines 4"),
    ],
)
def test_ranges_that_cannot_work_are_refused_in_one_line(args, message) -> None:
    text = refused(*args, *MACHINE)
    assert message in text and "\n" not in text


def test_inside_slurm_the_job_id_names_the_rendezvous_and_the_allocation_must_fit() -> None:
    got = plan("--num_machines", "2:3", "--cpu", environ=SLURM_NODE)
    command = " ".join(got.argv)
    assert "--nnodes 2:3 --nproc-per-node 1 " in command and "--rdzv-id x-slurm-4242" in command
    assert "does not hold the 3 node(s) SLURM gave" in refused("--num_machines", "1:2", "--cpu", environ=SLURM_NODE)


def test_the_cli_shows_the_elastic_plan_and_refuses_a_bad_range(tmp_path: Path) -> None:
    launcher = [sys.executable, "-m", "x_launch"]
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    shown = subprocess.run(
        [*launcher, "--num_machines", "2:3", "--num_processes", "3", *MACHINE, "--dry-run", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "--nnodes 2:3" in shown.stdout and "  min_machines: 2  [--num_machines 2:3]" in shown.stdout
    bad = subprocess.run([*launcher, "--num_machines", "0:3", str(script)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "min_machines" in bad.stderr


MEET = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(f"world={dist.get_world_size()} sum={t.item():g} agent_store={os.environ['TORCHELASTIC_USE_AGENT_STORE']}")
dist.destroy_process_group()
"""


def test_an_elastic_job_starts_once_its_fewest_machines_have_joined(console_script, tmp_path: Path) -> None:
    """Two launchers of ``--num_machines 2:3`` on this machine: the job starts without the third."""
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    port = _free_port()
    argv = [console_script("x-launch"), "--num_machines", "2:3", "--num_processes", "3", "--cpu"]
    argv += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
    argv += ["--rdzv_conf", "last_call_timeout=1", "--rdzv_timeout", "120", str(script), str(tmp_path)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    machines = [subprocess.Popen(argv, env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    machines.append(subprocess.Popen(argv, env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [machine.communicate(timeout=150)[0] for machine in machines]
    finally:
        for machine in machines:
            machine.kill()
    assert [machine.returncode for machine in machines] == [0, 0], "\n".join(outputs)[-4000:]
    lines = sorted(path.read_text() for path in tmp_path.glob("rank*.txt"))
    # a store of their own for the round's workers, not the agent's (see launch_plan)
    assert lines == ["world=2 sum=2 agent_store=False"] * 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_store_host_is_the_machine_that_owns_the_address() -> None:
    from x_launch.engines import preflight

    assert not preflight.hosts_rendezvous_store("127.0.0.1", 29411)  # torch's own guess is right there
    assert not preflight.hosts_rendezvous_store("192.0.2.77", 29411)  # TEST-NET-1: no machine of ours
    own = preflight.route_address("192.0.2.77", 29411)  # this machine's address on the way out
    if own is None or own.startswith("127."):
        pytest.skip("this machine has no route off the loopback")
    port = _free_port()
    assert preflight.hosts_rendezvous_store(own, port)
    with socket.socket() as holder:  # a launcher of this machine started the store already
        holder.bind((own, port))
        holder.listen()
        assert not preflight.hosts_rendezvous_store(own, port)
