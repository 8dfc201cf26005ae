"""x-launch on a real SLURM cluster: srun with one rank per task, the batch script, two nodes.

The cluster is the local test cluster (integration-tests/conftest.py starts it with two nodes,
node1 and node2, both on this host). Every rank writes its view of the job to a file of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.requires_slurm

WORKER = Path(__file__).resolve().parent / "workers" / "slurm_rank.py"
TIMEOUT = 300  # seconds per job: two cores, torch imported by every rank


@pytest.fixture
def job(console_script, tmp_path: Path):
    """Run a SLURM command (srun/sbatch) with a clean environment; return (result, ranks by number)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("X_", "SLURM_", "RANK", "LOCAL_", "WORLD_SIZE", "MASTER_", "GROUP_RANK", "TORCHELASTIC"))
    }
    clean.update(
        OMP_NUM_THREADS="1",
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        HF_HOME=str(tmp_path / "hf"),
        PYTHONUNBUFFERED="1",
    )
    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    name = f"x-launch-test-{uuid.uuid4().hex[:8]}"

    def fill(text: str) -> str:
        return text.replace("X_LAUNCH", console_script("x-launch")).replace("OUT", str(out_dir))

    def run(*argv: str) -> tuple[subprocess.CompletedProcess[str], dict[int, dict]]:
        """``argv`` with X_LAUNCH and OUT standing for the console script and the ranks' folder."""
        argv = tuple(fill(a) for a in argv)
        try:
            result = subprocess.run(
                [argv[0], f"--job-name={name}", *argv[1:]],
                capture_output=True,
                text=True,
                env=clean,
                cwd=tmp_path,
                timeout=TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            subprocess.run(["scancel", f"--name={name}"], capture_output=True, timeout=30)
            pytest.fail(f"{' '.join(argv)} did not finish within {TIMEOUT} s")
        ranks = {}
        for path in sorted(out_dir.glob("rank*.json")):
            record = json.loads(path.read_text())
            ranks[record["rank"]] = record
        return result, ranks

    run.fill = fill  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def slurm_nodes() -> int:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in out.stdout.splitlines() if line.split()[1].rstrip("*~#") in ("idle", "mix", "alloc"))


def need_nodes(have: int, wanted: int) -> None:
    if have < wanted:
        pytest.skip(f"needs a {wanted}-node SLURM cluster, this one has {have} (start it with SLURM_LOCAL_NODES=2)")


def assert_one_world(ranks: dict[int, dict], world: int) -> None:
    assert sorted(ranks) == list(range(world)), ranks
    for record in ranks.values():
        assert (record["world"], record["sum"]) == (world, world * (world + 1) / 2), record
        assert record["env"]["X_LAUNCHED"] == "1", record
    assert len({r["pid"] for r in ranks.values()}) == world


def log(result: subprocess.CompletedProcess[str], tmp_path: Path | None = None) -> str:
    text = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    for path in sorted(tmp_path.glob("slurm-*.out")) if tmp_path else []:
        text += f"\n{path.name}:\n{path.read_text()}"
    return text


def test_srun_with_two_tasks_makes_every_task_one_rank(job) -> None:
    result, ranks = job("srun", "--nodes=1", "--ntasks=2", "X_LAUNCH", "--cpu", str(WORKER), "OUT")
    assert result.returncode == 0, log(result)
    assert_one_world(ranks, 2)
    for rank, record in ranks.items():
        seen = record["env"]
        assert (seen["RANK"], seen["SLURM_PROCID"], seen["LOCAL_RANK"]) == (str(rank), str(rank), str(rank))
        assert (seen["WORLD_SIZE"], seen["LOCAL_WORLD_SIZE"]) == ("2", "2")
        assert seen["TORCHELASTIC_RUN_ID"] is None  # no torchrun: the interpreter ran the script
        assert int(seen["MASTER_PORT"]) == 20000 + int(seen["SLURM_JOB_ID"]) % 20000


def test_the_runtime_picks_up_the_ranks_srun_gave(job) -> None:
    pytest.importorskip("x_runtime")
    result, ranks = job("srun", "--nodes=1", "--ntasks=2", "X_LAUNCH", "--cpu", str(WORKER), "OUT", "--accelerator")
    assert result.returncode == 0, log(result)
    assert_one_world(ranks, 2)
    assert [ranks[r]["local_rank"] for r in (0, 1)] == [0, 1]


def test_the_runtime_under_plain_srun_python_forms_one_world_without_x_launch(job) -> None:
    # No launcher: the Accelerator reads SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST itself.
    pytest.importorskip("x_runtime")
    result, ranks = job("srun", "--nodes=1", "--ntasks=2", sys.executable, str(WORKER), "OUT", "--accelerator")
    assert result.returncode == 0, log(result)
    assert sorted(ranks) == [0, 1]
    for rank, record in ranks.items():
        assert (record["world"], record["sum"], record["local_rank"]) == (2, 3.0, rank)
        assert record["env"]["X_LAUNCHED"] is None and record["env"]["RANK"] is None


def test_a_mismatch_inside_srun_is_one_error_line_per_task(job) -> None:
    result, ranks = job("srun", "--nodes=1", "--ntasks=2", "X_LAUNCH", "--num_processes", "3", str(WORKER), "OUT")
    assert result.returncode != 0 and ranks == {}
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert (
        errors
        == [
            "Error: num_processes 3 (from --num_processes) disagrees with srun: it started 2 tasks (SLURM_NTASKS=2) "
            "and each task is one process; use srun -n 3, or srun --ntasks-per-node=1 to let x-launch start the "
            "processes on each node"
        ]
        * 2
    ), log(result)


def test_sbatch_script_on_one_node_runs_torchrun_there(job, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        job.fill(
            f"#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --output=slurm-%j.out\nX_LAUNCH --num_processes 2 --cpu {WORKER} OUT\n"
        )
    )
    result, ranks = job("sbatch", "--wait", str(script))
    assert result.returncode == 0, log(result, tmp_path)
    assert_one_world(ranks, 2)
    for record in ranks.values():
        seen = record["env"]
        assert seen["TORCHELASTIC_RUN_ID"] is not None and seen["SLURM_STEP_ID"] is None  # torchrun, in the batch step
        assert seen["GROUP_RANK"] == "0"


def test_srun_one_task_per_node_on_two_nodes_forms_one_world_of_four(job, slurm_nodes: int) -> None:
    need_nodes(slurm_nodes, 2)
    result, ranks = job(
        "srun", "--nodes=2", "--ntasks-per-node=1", "X_LAUNCH", "--num_processes", "4", "--cpu", str(WORKER), "OUT"
    )
    assert result.returncode == 0, log(result)
    assert_one_world(ranks, 4)
    by_node = {r: (ranks[r]["env"]["GROUP_RANK"], ranks[r]["env"]["SLURMD_NODENAME"]) for r in ranks}
    assert by_node == {0: ("0", "node1"), 1: ("0", "node1"), 2: ("1", "node2"), 3: ("1", "node2")}
    assert [ranks[r]["local_rank"] for r in range(4)] == [0, 1, 0, 1]
    assert {ranks[r]["env"]["MASTER_ADDR"] for r in ranks} == {"node1"}


def test_sbatch_script_on_two_nodes_starts_one_x_launch_per_node(job, slurm_nodes: int, tmp_path: Path) -> None:
    need_nodes(slurm_nodes, 2)
    script = tmp_path / "job.sh"
    script.write_text(
        job.fill(
            "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --output=slurm-%j.out\n"
            f"X_LAUNCH --num_processes 4 --cpu {WORKER} OUT\n"
        )
    )
    result, ranks = job("sbatch", "--wait", str(script))
    assert result.returncode == 0, log(result, tmp_path)
    assert_one_world(ranks, 4)
    nodes = sorted((ranks[r]["env"]["GROUP_RANK"], ranks[r]["env"]["SLURMD_NODENAME"]) for r in ranks)
    assert nodes == [("0", "node1"), ("0", "node1"), ("1", "node2"), ("1", "node2")]
    assert {ranks[r]["env"]["SLURM_STEP_ID"] for r in ranks} == {"0"}  # exactly one step: no recursion


def test_dry_run_inside_real_steps_shows_slurm_sources(job, slurm_nodes: int) -> None:
    need_nodes(slurm_nodes, 2)
    result, _ = job(
        "srun", "--nodes=2", "--ntasks-per-node=1", "--label", "X_LAUNCH", "--cpu", "--dry-run", str(WORKER), "OUT"
    )
    assert result.returncode == 0, log(result)
    lines = result.stdout.splitlines()
    for node in (0, 1):
        for line in ("num_machines: 2  [slurm]", f"machine_rank: {node}  [slurm]", "main_process_ip: node1  [slurm]"):
            assert any(x.startswith(f"{node}:") and x.endswith(line) for x in lines), log(result)


TRAIN = Path(__file__).resolve().parent / "workers" / "train_parity.py"


def _trained(path: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(path)).items() if k.startswith("weights.")}


@pytest.fixture(scope="module")
def single_process_weights(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("single") / "weights.safetensors"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "SLURM_", "RANK", "WORLD_SIZE"))}
    done = subprocess.run([sys.executable, str(TRAIN), str(out), "--epochs", "2"], env=clean, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return _trained(out)


@pytest.mark.parametrize("how", ["srun", "sbatch"])
def test_training_under_slurm_equals_the_single_process_run(job, tmp_path: Path, how, single_process_weights) -> None:
    import torch

    out = tmp_path / "weights.safetensors"
    if how == "srun":  # one task per rank
        result, _ = job("srun", "--nodes=1", "--ntasks=2", "X_LAUNCH", "--cpu", str(TRAIN), str(out), "--epochs", "2")
    else:  # the batch script runs x-launch, which starts both ranks
        script = tmp_path / "train.sh"
        script.write_text(
            job.fill(
                "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --output=slurm-%j.out\n"
                f"X_LAUNCH --num_processes 2 --cpu {TRAIN} {out} --epochs 2\n"
            )
        )
        result, _ = job("sbatch", "--wait", str(script))
    assert result.returncode == 0, log(result, tmp_path)
    text = result.stdout + "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert text.count("world size 2") == 2, text[-2000:]  # both ranks, one world
    got = _trained(out)
    assert got.keys() == single_process_weights.keys()
    for name, value in got.items():
        torch.testing.assert_close(value, single_process_weights[name], rtol=1e-5, atol=1e-5)


TRAINER = Path(__file__).resolve().parent / "workers" / "trainer_job.py"


@pytest.fixture(scope="module")
def trainer_reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """transformers' Trainer on 2 processes under x-launch (torchrun), x serving accelerate: the final weights."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("trainer-reference")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    clean["OMP_NUM_THREADS"] = "1"
    launcher = str(Path(sys.executable).with_name("x-launch"))
    argv = [launcher, "--num_processes", "2", "--cpu", "--provide-accelerate", str(TRAINER), str(out)]
    done = subprocess.run(argv, env=clean, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-2000:]
    from safetensors.torch import load_file

    return load_file(str(out / "final.safetensors"))


@pytest.mark.parametrize("how", ["x-launch", "python"])
def test_a_trainer_run_under_srun_serving_accelerate_equals_torchrun(
    job, tmp_path: Path, how, trainer_reference
) -> None:
    """srun's tasks as ranks, x serving `import accelerate`: through x-launch --provide-accelerate, or plain python."""
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "run"
    if how == "x-launch":
        argv = ("srun", "--nodes=1", "--ntasks=2", "X_LAUNCH", "--cpu", "--provide-accelerate", str(TRAINER), str(out))
    else:
        argv = (
            "srun",
            "--nodes=1",
            "--ntasks=2",
            "--export=ALL,X_PROVIDE_ACCELERATE=1",
            sys.executable,
            str(TRAINER),
            str(out),
        )
    result, _ = job(*argv)
    assert result.returncode == 0, log(result, tmp_path)
    assert (result.stdout + result.stderr).count("accelerate is served by x-runtime") == 1, log(result, tmp_path)
    got = load_file(str(out / "final.safetensors"))
    assert got.keys() == trainer_reference.keys()
    assert all(torch.equal(got[name], trainer_reference[name]) for name in got)
