"""Accelerate's launch and config entry points on x-launch (``x_launch.cli.accelerate``), side by
side with Accelerate's own (1.15, installed beside): the parser the ``trl`` CLI uses, a real launch
from it, config files read as ``accelerate.commands.config`` reads them, and the environment a
launch with ``--provide-accelerate`` gives its processes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config import load_config_from_file as their_load_config_from_file
from accelerate.commands.launch import launch_command_parser as their_launch_command_parser

from x_common import env
from x_launch.cli import main
from x_launch.cli.accelerate import launch_command, launch_command_parser, load_config_from_file
from x_launch.config.file import accelerate_config_path

# ---------------------------------------------------------------------------------------------
# launch_command_parser


def test_options_then_the_script_and_its_own_arguments() -> None:
    argv = ["--num_processes", "2", "--cpu", "--mixed_precision", "bf16", "train.py", "--lr", "1e-3"]
    args = launch_command_parser().parse_args(argv)
    theirs = their_launch_command_parser().parse_args(argv)
    assert (args.training_script, args.training_script_args) == ("train.py", ["--lr", "1e-3"])
    assert (args.training_script, args.training_script_args) == (theirs.training_script, theirs.training_script_args)
    assert args.use_cpu is theirs.cpu is True  # x names it after --use_cpu, Accelerate after --cpu
    assert args.mixed_precision == theirs.mixed_precision == "bf16"
    assert args.num_processes == "2"  # x keeps the text (x-launch checks it); Accelerate's parser gives 2
    assert args.module is None and args.config_file is None  # what was not given stays unset


def test_a_module_target_and_a_config_file() -> None:
    argv = ["--config_file", "f.yaml", "-m", "pkg.mod", "--data", "d"]
    args = launch_command_parser().parse_args(argv)
    theirs = their_launch_command_parser().parse_args(argv)
    assert (args.config_file, args.module, args.training_script, args.training_script_args) == (
        "f.yaml",
        True,
        "pkg.mod",
        ["--data", "d"],
    )
    assert (args.config_file, args.module, args.training_script, args.training_script_args) == (
        theirs.config_file,
        theirs.module,
        theirs.training_script,
        theirs.training_script_args,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--num_processes", "4", "--mixed_precision", "fp16", "-m", "x", "--cpu"],
        ["-m", "pkg.mod", "--config_file", "other.yaml", "--multi_gpu"],
        ["--cpu", "train.py", "--", "--num_processes", "3"],
    ],
    ids=["script", "module", "double-dash"],
)
def test_the_scripts_own_arguments_are_never_launcher_options(argv: list[str]) -> None:
    args = launch_command_parser().parse_args(argv)
    theirs = their_launch_command_parser().parse_args(argv)
    assert args.training_script_args == theirs.training_script_args
    assert "--num_processes" in args.training_script_args or "--config_file" in args.training_script_args
    assert args.num_processes is None and args.mixed_precision is None and args.multi_gpu is None
    assert args.config_file is None


def test_accelerate_spellings_of_other_options() -> None:
    argv = [
        "--multi_gpu",
        "--num_machines",
        "1",
        "--gradient_accumulation_steps",
        "4",
        "--dynamo_backend",
        "inductor",
        "--use_fsdp",
        "--fsdp_sharding_strategy",
        "FULL_SHARD",
        "t.py",
    ]
    args = launch_command_parser().parse_args(argv)
    theirs = their_launch_command_parser().parse_args(argv)
    for name in ("multi_gpu", "use_fsdp", "dynamo_backend", "fsdp_sharding_strategy", "training_script"):
        assert getattr(args, name) == getattr(theirs, name), name
    for name in ("num_machines", "gradient_accumulation_steps"):
        assert getattr(args, name) == str(getattr(theirs, name)), name
    assert args.training_script_args == []


@pytest.mark.parametrize(
    "flags",
    [["--fsdp_activation_checkpointing_offload", "false"], ["--deepspeed_multinode_launcher", "standard"]],
    ids=["checkpointing-offload-false", "standard-multinode-launcher"],
)
def test_the_parser_takes_what_x_launch_takes(capsys, tmp_path: Path, flags: list[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(SystemExit) as info:
        main(["--dry-run", *flags, str(script)])  # x-launch accepts these values: what x does anyway
    assert info.value.code == 0, capsys.readouterr().err
    args = launch_command_parser().parse_args([*flags, str(script)])
    assert (args.training_script, args.training_script_args) == (str(script), [])


def test_an_unknown_option_before_the_script_is_an_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        launch_command_parser().parse_args(["--no_such_option", "train.py"])
    assert info.value.code == 2
    assert "--no_such_option" in capsys.readouterr().err


def test_the_parser_as_a_subcommand() -> None:
    root = argparse.ArgumentParser(prog="trl")
    sub = root.add_subparsers()
    launch_command_parser(sub)
    args = root.parse_args(["launch", "--num_processes", "1", "train.py", "--x", "1"])
    assert args.func is launch_command
    assert (args.num_processes, args.training_script, args.training_script_args) == ("1", "train.py", ["--x", "1"])


# ---------------------------------------------------------------------------------------------
# launch_command: real launches

RECORD = """
import json, os, sys
rank = os.environ.get("RANK", "single")
with open(os.path.join(os.environ["OUT_DIR"], f"{rank}.json"), "w") as f:
    json.dump({"world": os.environ.get("WORLD_SIZE"), "argv": sys.argv[1:], "cpu": os.environ.get("X_USE_CPU"),
               "mp": os.environ.get("X_MIXED_PRECISION"),
               "accelerate": sorted(k for k in os.environ if k.startswith("ACCELERATE_"))}, f)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture
def record(tmp_path: Path, monkeypatch) -> tuple[str, Path]:
    script = tmp_path / "record.py"
    script.write_text(RECORD)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT_DIR", str(out))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "EXIT_WITH"):
        monkeypatch.delenv(name, raising=False)
    return str(script), out


def _written(out: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


def test_one_process_runs_the_script_with_its_arguments(record) -> None:
    script, out = record
    args = launch_command_parser().parse_args(
        ["--num_processes", "1", "--mixed_precision", "fp16", script, "--lr", "1e-3"]
    )
    assert launch_command(args) is None
    written = _written(out)
    assert list(written) == ["single"]
    assert written["single"]["argv"] == ["--lr", "1e-3"]
    assert written["single"]["mp"] == "fp16"


def test_two_cpu_processes_each_run_the_script(record) -> None:
    script, out = record
    args = launch_command_parser().parse_args(
        ["--num_processes", "2", "--cpu", "--mixed_precision", "bf16", script, "--num_processes", "7"]
    )
    assert launch_command(args) is None
    written = _written(out)
    assert list(written) == ["0", "1"]
    for rank in ("0", "1"):
        assert written[rank]["world"] == "2"
        assert written[rank]["argv"] == ["--num_processes", "7"]
        assert (written[rank]["cpu"], written[rank]["mp"]) == ("1", "bf16")
        assert written[rank]["accelerate"] == []  # Accelerate's variables only with --provide-accelerate


def test_a_failing_script_raises_called_process_error(record, monkeypatch) -> None:
    script, _ = record
    monkeypatch.setenv("EXIT_WITH", "3")
    with pytest.raises(subprocess.CalledProcessError) as info:
        launch_command(launch_command_parser().parse_args([script, "--a"]))
    assert info.value.returncode == 3  # one process: the script's own exit code
    assert info.value.cmd == ["x-launch", script, "--a"]


def test_a_bad_config_file_raises_called_process_error(record, tmp_path: Path, capsys) -> None:
    script, out = record
    config = tmp_path / "bad.yaml"
    config.write_text("num_processes: two\n")
    with pytest.raises(subprocess.CalledProcessError) as info:
        launch_command(launch_command_parser().parse_args(["--config_file", str(config), script]))
    assert info.value.returncode == 2  # x-launch's exit code for bad input
    assert "num_processes: 'two' is not valid" in capsys.readouterr().err
    assert _written(out) == {}  # nothing ran


# ---------------------------------------------------------------------------------------------
# load_config_from_file

CONFIG = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_use_orig_params: true
  fsdp_version: 1
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
use_cpu: false
gpu_ids: all
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: default
"""


def test_a_config_file_reads_as_accelerate_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "fsdp.yaml"
    path.write_text(CONFIG)
    ours = load_config_from_file(path).to_dict()
    theirs = their_load_config_from_file(str(path)).to_dict()
    held = yaml.safe_load(CONFIG)
    assert {key: ours.get(key) for key in held} == {key: theirs[key] for key in held}
    assert ours["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    config = load_config_from_file(str(path))
    assert (config.num_processes, config.distributed_type, config.mixed_precision) == (2, "FSDP", "bf16")
    assert config.fsdp_config == theirs["fsdp_config"]


def test_a_config_file_accelerate_wrote_reads_as_accelerate_reads_it(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    path = tmp_path / "written.yaml"
    ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        distributed_type="MULTI_GPU",
        mixed_precision="bf16",
        use_cpu=False,
        debug=False,
        num_processes=2,
        downcast_bf16="no",
        fsdp_config={"fsdp_version": 2, "fsdp_reshard_after_forward": True},
    ).to_yaml_file(str(path))  # what `accelerate config` writes
    held = yaml.safe_load(path.read_text())
    ours = load_config_from_file(path).to_dict()
    theirs = their_load_config_from_file(str(path)).to_dict()
    assert {key: ours.get(key) for key in held} == {key: theirs[key] for key in held}


def test_a_missing_explicit_file_is_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml"):
        load_config_from_file(missing)
    with pytest.raises(FileNotFoundError):
        their_load_config_from_file(str(missing))


def test_the_default_config_path_follows_accelerates_rule(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(env.HF_HOME.name, str(tmp_path / "hf"))
    monkeypatch.setenv(env.XDG_CACHE_HOME.name, str(tmp_path / "xdg"))
    assert accelerate_config_path() == tmp_path / "hf" / "accelerate" / "default_config.yaml"
    monkeypatch.delenv(env.HF_HOME.name)
    assert accelerate_config_path() == tmp_path / "xdg" / "huggingface" / "accelerate" / "default_config.yaml"
    monkeypatch.setenv(env.XDG_CACHE_HOME.name, "~/cache")
    assert accelerate_config_path() == home / "cache" / "huggingface" / "accelerate" / "default_config.yaml"
    monkeypatch.delenv(env.XDG_CACHE_HOME.name)
    assert accelerate_config_path() == home / ".cache" / "huggingface" / "accelerate" / "default_config.yaml"
    monkeypatch.setenv(env.HF_HOME.name, "~/hf")
    assert accelerate_config_path() == home / "hf" / "accelerate" / "default_config.yaml"


ACCELERATE_AND_X = """
import importlib, json, os, sys
import x_launch
from accelerate.commands.config import config_args
# at import, under the HF_HOME given: both default files, and what None reads
out = {"default": [x_launch.default_config_file, config_args.default_config_file,
                   x_launch.load_config_from_file(None).to_dict()], "rule": []}
for case in json.loads(sys.argv[1]):
    for name in ("HF_HOME", "XDG_CACHE_HOME"):
        os.environ.pop(name, None)
    os.environ.update(case)
    out["rule"].append(importlib.reload(config_args).default_yaml_config_file)
print(json.dumps(out))
"""


def test_none_reads_the_default_file_where_accelerate_looks(tmp_path: Path, monkeypatch) -> None:
    home, hf = tmp_path / "home", tmp_path / "hf"
    (hf / "accelerate").mkdir(parents=True)
    (hf / "accelerate" / "default_config.yaml").write_text(CONFIG)
    cases = [
        {"HF_HOME": str(hf), "XDG_CACHE_HOME": str(tmp_path / "xdg")},
        {"XDG_CACHE_HOME": str(tmp_path / "xdg")},
        {"XDG_CACHE_HOME": "~/cache"},
        {"HF_HOME": "~/hf"},
        {},
    ]
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "XDG_CACHE_HOME")}
    done = subprocess.run(  # one interpreter: Accelerate computes its path once, at import
        [sys.executable, "-c", ACCELERATE_AND_X, json.dumps(cases)],
        env={**clean, "HOME": str(home), "HF_HOME": str(hf)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    ours_path, their_path, values = result["default"]
    assert ours_path == their_path == str(hf / "accelerate" / "default_config.yaml")
    assert values == load_config_from_file(hf / "accelerate" / "default_config.yaml").to_dict()
    assert values["num_processes"] == 2 and values["fsdp_config"]["fsdp_version"] == 1
    monkeypatch.setenv("HOME", str(home))
    ours = []
    for case in cases:
        for name in ("HF_HOME", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)
        for name, value in case.items():
            monkeypatch.setenv(name, value)
        ours.append(str(accelerate_config_path()))
    assert ours == result["rule"]


# ---------------------------------------------------------------------------------------------
# --provide-accelerate


def dry_run_environment(capsys, tmp_path: Path, *args: str) -> dict[str, str]:
    """The child environment ``x-launch --dry-run`` prints."""
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(SystemExit) as info:
        main(["--dry-run", *args, str(script), "--provide-accelerate"])  # the script's own argument
    out = capsys.readouterr().out
    assert info.value.code == 0, out
    lines = out.splitlines()
    return dict(line.strip().split("=", 1) for line in lines[lines.index("environment:") + 1 :])


BASE = ("--num_processes", "2", "--cpu", "--mixed_precision", "bf16")


@pytest.mark.parametrize("flag", ["--provide-accelerate", "--provide_accelerate"])
def test_provide_accelerate_sets_x_and_accelerates_variables(capsys, tmp_path: Path, flag: str) -> None:
    child = dry_run_environment(capsys, tmp_path, flag, *BASE)
    assert child["X_PROVIDE_ACCELERATE"] == "1"
    assert child["ACCELERATE_MIXED_PRECISION"] == child["X_MIXED_PRECISION"] == "bf16"
    assert child["ACCELERATE_USE_CPU"] == "1"
    assert "ACCELERATE_USE_FSDP" not in child


def test_provide_accelerate_spells_a_strategy_as_accelerate_launch_does(capsys, tmp_path: Path) -> None:
    child = dry_run_environment(capsys, tmp_path, "--provide-accelerate", "--use_fsdp", "--num_processes", "2")
    assert child["ACCELERATE_USE_FSDP"] == "true" and child["X_DISTRIBUTED_TYPE"] == "FSDP"


def test_provide_accelerate_from_the_environment(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("X_LAUNCH_PROVIDE_ACCELERATE", "true")
    child = dry_run_environment(capsys, tmp_path, *BASE)
    assert child["X_PROVIDE_ACCELERATE"] == "1" and child["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_without_provide_accelerate_no_accelerate_variables(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("X_PROVIDE_ACCELERATE", raising=False)
    child = dry_run_environment(capsys, tmp_path, *BASE)
    assert "X_PROVIDE_ACCELERATE" not in child  # the launcher's own environment reaches the ranks unchanged
    assert child["X_MIXED_PRECISION"] == "bf16"
    assert [name for name in child if name.startswith("ACCELERATE_")] == []


def test_a_launcher_serving_accelerate_launches_ranks_that_do_too(capsys, tmp_path: Path, monkeypatch) -> None:
    """`accelerate launch` under X_PROVIDE_ACCELERATE=1 is x-launch: its ranks see Accelerate's variables too."""
    monkeypatch.setenv("X_PROVIDE_ACCELERATE", "1")
    child = dry_run_environment(capsys, tmp_path, *BASE)
    assert child["ACCELERATE_MIXED_PRECISION"] == "bf16" and "X_PROVIDE_ACCELERATE" not in child


def test_accelerates_variables_mean_what_accelerate_launch_sets(capsys, tmp_path: Path) -> None:
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils import str_to_bool
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    script = tmp_path / "train.py"
    args, *_ = _validate_launch_command(their_launch_command_parser().parse_args([*BASE, str(script)]))
    _, theirs = prepare_simple_launcher_cmd_env(args)
    capsys.readouterr()
    ours = dry_run_environment(capsys, tmp_path, "--provide-accelerate", *BASE)
    assert ours["ACCELERATE_MIXED_PRECISION"] == theirs["ACCELERATE_MIXED_PRECISION"]
    assert str_to_bool(ours["ACCELERATE_USE_CPU"]) == str_to_bool(theirs["ACCELERATE_USE_CPU"]) == 1
