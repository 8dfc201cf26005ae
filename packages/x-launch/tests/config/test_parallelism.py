"""Accelerate's ParallelismConfig at launch: flags and config-file keys, what the ranks get, what is refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from x_common import env
from x_launch.cli import main
from x_launch.config import parallelism
from x_launch.config.contract_env import contract_environment
from x_launch.config.file import load_config
from x_launch.config.launch_config import TABLE
from x_launch.config.resolve import resolve

# The variables accelerate launch writes for a ParallelismConfig, by name.
VARIABLES = {row.env.name: row.env for row in TABLE if parallelism.owns(row) and row.env is not None}
ON = env.USE_PARALLELISM_CONFIG.format(True)  # ACCELERATE_USE_PARALLELISM_CONFIG, as x-common spells true


def launch(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def child_environment(capsys, *args: str) -> dict[str, str]:
    """The ParallelismConfig part of the environment ``--dry-run`` prints for the ranks."""
    code, out, err = launch(capsys, "--dry-run", *args)
    assert code == 0, err
    lines = out.splitlines()
    shown = dict(line.strip().split("=", 1) for line in lines[lines.index("environment:") + 1 :])
    return {name: text for name, text in shown.items() if name in VARIABLES}


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    return str(path)


# --- flags -> the ranks' environment ------------------------------------------------------------


def test_hsdp_times_tensor_parallel_flags_give_the_ranks_accelerates_variables(capsys, script) -> None:
    child = child_environment(
        capsys,
        "--cpu", "--num_processes", "8",
        "--parallelism_config_dp_replicate_size", "2",
        "--parallelism-config-dp-shard-size", "2",
        "--parallelism_config_tp_size", "2",
        script,
    )  # fmt: skip
    assert child == {
        "ACCELERATE_USE_PARALLELISM_CONFIG": ON,
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
        "PARALLELISM_CONFIG_CP_SIZE": "1",
        "PARALLELISM_CONFIG_CP_BACKEND": "torch",
        "PARALLELISM_CONFIG_SP_SIZE": "1",
        "PARALLELISM_CONFIG_SP_BACKEND": "deepspeed",
    }


def test_the_switch_alone_sends_the_all_ones_config(capsys, script) -> None:
    # Accelerate's runtime then replicates over every process (dp_replicate_size = num_processes).
    child = child_environment(capsys, "--cpu", "--num_processes", "2", "--use_parallelism_config", script)
    assert child["ACCELERATE_USE_PARALLELISM_CONFIG"] == ON
    assert [child[f"PARALLELISM_CONFIG_{d}_SIZE"] for d in ("DP_REPLICATE", "DP_SHARD", "TP", "CP", "SP")] == ["1"] * 5


def test_without_parallelism_the_ranks_get_none_of_its_variables(capsys, script) -> None:
    assert child_environment(capsys, "--cpu", "--num_processes", "2", script) == {}
    assert child_environment(capsys, "--use_fsdp", "--num_processes", "2", "--cpu", script) == {}


def test_context_parallel_strategy_travels_only_with_cp_size_above_one() -> None:
    flags = {"num_processes": "4", "parallelism_config_dp_shard_size": "2", "parallelism_config_cp_size": "2"}
    assert contract_environment(resolve(None, flags, {}))["PARALLELISM_CONFIG_CP_COMM_STRATEGY"] == "allgather"
    flags["parallelism_config_cp_comm_strategy"] = "alltoall"
    assert contract_environment(resolve(None, flags, {}))["PARALLELISM_CONFIG_CP_COMM_STRATEGY"] == "alltoall"
    no_cp = {"parallelism_config_tp_size": "2", "parallelism_config_cp_comm_strategy": "alltoall"}
    assert "PARALLELISM_CONFIG_CP_COMM_STRATEGY" not in contract_environment(resolve(None, no_cp, {}))


@pytest.mark.parametrize(
    "flags",
    [
        ["--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2"],
        ["--parallelism_config_dp_replicate_size", "2", "--parallelism_config_cp_size", "2",
         "--parallelism_config_cp_comm_strategy", "alltoall"],
        # sp is refused at launch, but the variables are Accelerate's all the same. (Accelerate's flag is
        # argparse type=bool, so its "false" is True; x reads the word: false is False.)
        ["--parallelism_config_sp_size", "4", "--parallelism_config_sp_seq_length", "1024",
         "--parallelism_config_sp_seq_length_is_variable", "true",
         "--parallelism_config_sp_attn_implementation", "flash_attention_2"],
        [],
    ],
    ids=["fsdp-tp", "hsdp-cp", "sp", "all-ones"],
)  # fmt: skip
def test_the_variables_are_the_ones_accelerate_launch_writes(flags: list[str]) -> None:
    launch_module = pytest.importorskip("accelerate.commands.launch")
    accelerate_env = pytest.importorskip("accelerate.utils.launch")
    args = launch_module.launch_command_parser().parse_args([*flags, "--use_parallelism_config", "train.py"])
    theirs = accelerate_env.prepare_extend_env_parallelism_config(args, {})
    given = dict(zip([f.removeprefix("--") for f in flags[::2]], flags[1::2], strict=True))
    ours = contract_environment(resolve(None, {**given, "use_parallelism_config": True}, {}))
    ours = {name: text for name, text in ours.items() if name in VARIABLES}
    assert sorted(ours) == sorted(theirs)
    # Compared as the runtime reads them: x-common writes true as 1 where Accelerate writes "true"/"True".
    assert {n: VARIABLES[n].kind.parse(n, t) for n, t in ours.items()} == {
        n: VARIABLES[n].kind.parse(n, t) for n, t in theirs.items()
    }


def test_two_ranks_started_with_parallelism_flags_see_accelerates_variables(console_script, tmp_path: Path) -> None:
    dump = tmp_path / "dump.py"
    dump.write_text(
        "import json, os\n"
        f"names = {sorted(VARIABLES)!r}\n"
        "seen = {name: os.environ[name] for name in names if name in os.environ}\n"
        "with open(os.path.join(os.environ['OUT_DIR'], 'rank' + os.environ['RANK'] + '.json'), 'w') as f:\n"
        "    json.dump(seen, f)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "RANK", "WORLD_SIZE", "MASTER_"))}
    clean = {k: v for k, v in clean.items() if k not in VARIABLES}
    out = subprocess.run(
        [console_script("x-launch"), "--cpu", "--num_processes", "2", "--main_process_port", "0",
         "--parallelism_config_tp_size", "2", str(dump)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**clean, "OUT_DIR": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HF_HOME": str(tmp_path / "hf")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    expected = {
        "ACCELERATE_USE_PARALLELISM_CONFIG": ON,
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "1",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
        "PARALLELISM_CONFIG_CP_SIZE": "1",
        "PARALLELISM_CONFIG_CP_BACKEND": "torch",
        "PARALLELISM_CONFIG_SP_SIZE": "1",
        "PARALLELISM_CONFIG_SP_BACKEND": "deepspeed",
    }
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)] == [expected, expected]


# --- the config file's parallelism_config, and flags over it --------------------------------------

# As `accelerate config` writes it (commands/config/cluster.py): Accelerate's keys, prefix kept.
FILE = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 4
use_cpu: true
fsdp_config:
  fsdp_version: 2
parallelism_config:
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2
  parallelism_config_cp_comm_strategy: alltoall
"""


def test_a_config_files_parallelism_config_turns_it_on_and_travels(capsys, script, tmp_path: Path) -> None:
    path = tmp_path / "launch.yaml"
    path.write_text(FILE)
    settings = resolve(load_config(path), {}, {})
    assert settings["use_parallelism_config"].value is True
    assert settings["use_parallelism_config"].source == f"implied by config file {path}"
    child = child_environment(capsys, "--config_file", str(path), script)
    assert child == {
        "ACCELERATE_USE_PARALLELISM_CONFIG": ON,
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
        "PARALLELISM_CONFIG_CP_SIZE": "1",
        "PARALLELISM_CONFIG_CP_BACKEND": "torch",
        "PARALLELISM_CONFIG_SP_SIZE": "1",
        "PARALLELISM_CONFIG_SP_BACKEND": "deepspeed",
    }


def test_flags_and_variables_beat_the_files_parallelism_config(capsys, script, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "launch.yaml"
    path.write_text(FILE)
    monkeypatch.setenv("X_LAUNCH_PARALLELISM_CONFIG_DP_SHARD_SIZE", "1")
    child = child_environment(capsys, "--config_file", str(path), "--parallelism_config_dp_replicate_size", "2", script)
    assert (child["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"], child["PARALLELISM_CONFIG_DP_SHARD_SIZE"]) == ("2", "1")
    assert child["PARALLELISM_CONFIG_TP_SIZE"] == "2"  # the file's, not overridden
    code, out, _ = launch(capsys, "config", "show", "--config_file", str(path))
    assert code == 0 and "ignored" not in out  # read, no longer listed among Accelerate features x lacks
    assert "  parallelism_config.parallelism_config_tp_size: 2  [config file" in out


def test_an_empty_parallelism_config_leaves_it_off(capsys, script, tmp_path: Path) -> None:
    # accelerate launch: use_parallelism_config = defaults.parallelism_config != {}
    path = tmp_path / "launch.yaml"
    path.write_text("num_processes: 2\nuse_cpu: true\nparallelism_config: {}\n")
    assert resolve(load_config(path), {}, {}).use_parallelism_config is False
    assert child_environment(capsys, "--config_file", str(path), script) == {}


def test_a_misspelt_key_in_parallelism_config_is_one_line(capsys, script, tmp_path: Path) -> None:
    path = tmp_path / "launch.yaml"
    path.write_text("parallelism_config:\n  parallelism_config_tp_sise: 2\n")
    code, out, err = launch(capsys, "--config_file", str(path), script)
    assert code == 2 and out == ""
    assert err == (
        f"Error: {path}, line 2: unknown key 'parallelism_config_tp_sise' in parallelism_config; "
        "did you mean 'parallelism_config_tp_size'?\n"
    )


# --- refused before anything starts: one line, exit code 2 -----------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--cpu", "--num_processes", "4", "--parallelism_config_tp_size", "2"],
            "parallelism_config sizes multiply to 2 (dp_replicate 1 x dp_shard 1 x tp 2 x cp 1 x sp 1), but the job "
            "runs 4 process(es) (num_processes from --num_processes): make the sizes multiply to 4, or launch 2 "
            "processes (--num_processes 2, all machines together)",
        ),
        (
            ["--cpu", "--num_processes", "2", "--parallelism_config_sp_size", "2"],
            "parallelism_config_sp_size 2 (from --parallelism_config_sp_size): x does not train sequence parallelism "
            "(DeepSpeed Ulysses); x-runtime trains DDP, FSDP2, HSDP, tensor and context parallelism: use "
            "--parallelism_config_cp_size on GPUs for long sequences, or --parallelism_config_dp_shard_size / "
            "--parallelism_config_tp_size to fit the model",
        ),
        (
            ["--use_deepspeed", "--num_processes", "2", "--parallelism_config_tp_size", "2"],
            "parallelism_config_tp_size 2 (from --parallelism_config_tp_size) cannot run under DeepSpeed "
            "(distributed_type DEEPSPEED from --use_deepspeed): x-runtime builds these meshes with FSDP2 and tensor "
            "parallelism; drop DeepSpeed, or the parallelism_config sizes",
        ),
        (
            ["--use_fsdp", "--fsdp_version", "1", "--num_processes", "2", "--parallelism_config_dp_shard_size", "2"],
            "fsdp_version 1 (from --fsdp_version) cannot shard over a ParallelismConfig mesh: use --fsdp_version 2, "
            "as accelerate launch requires, or drop the parallelism_config keys",
        ),
        (
            ["--cpu", "--num_processes", "2", "--parallelism_config_cp_size", "2"],
            "parallelism_config_cp_size 2 (from --parallelism_config_cp_size): context parallelism runs on GPUs only, "
            "and these ranks run on CPU (use_cpu from --use_cpu): launch on GPUs, or shard with "
            "--parallelism_config_dp_shard_size / --parallelism_config_tp_size",
        ),
        (
            ["--parallelism_config_dp_shard_size", "0"],
            "--parallelism_config_dp_shard_size: '0' is not valid: expected an integer >= 1",
        ),
        (
            ["--parallelism_config_cp_comm_strategy", "ring"],
            "--parallelism_config_cp_comm_strategy: 'ring' is not valid: expected one of allgather, alltoall",
        ),
    ],
    ids=["product", "sp", "deepspeed", "fsdp1", "cp-on-cpu", "size-0", "cp-strategy"],
)
def test_what_x_runtime_cannot_run_is_refused_in_one_line(capsys, script, tmp_path: Path, args, message) -> None:
    code, out, err = launch(capsys, *args, script)
    assert (code, out, err) == (2, "", f"Error: {message}\n")
    assert not (tmp_path / "started").exists()


def test_the_process_count_is_the_whole_job_over_every_machine(capsys, script) -> None:
    # 2 machines x 2 processes each: --num_processes 4 is the world, as in accelerate launch.
    args = ["--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "127.0.0.1", "--cpu"]
    child = child_environment(capsys, *args, "--num_processes", "4", "--parallelism_config_dp_shard_size", "4", script)
    assert child["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "4"
    # --dry-run: were the check lost, machine 1 would wait for machine 0 until the rendezvous timeout
    code, _, err = launch(
        capsys, "--dry-run", *args, "--num_processes", "4", "--parallelism_config_dp_shard_size", "2", script
    )
    assert code == 2 and "multiply to 2 (" in err and "runs 4 process(es)" in err


def test_a_size_from_the_config_file_is_named_with_the_file(capsys, script, tmp_path: Path) -> None:
    path = tmp_path / "launch.yaml"
    path.write_text("num_processes: 2\nuse_cpu: true\nparallelism_config:\n  parallelism_config_sp_size: 2\n")
    code, _, err = launch(capsys, "--config_file", str(path), script)
    assert code == 2
    assert err.startswith(f"Error: parallelism_config_sp_size 2 (from config file {path}): x does not train sequence")
