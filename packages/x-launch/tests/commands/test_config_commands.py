"""`x-launch config default` and `x-launch config show` through the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from x_launch.config.file import load_config
from x_launch.config.schema import SCHEMA


@pytest.fixture(scope="module")
def exe(console_script) -> str:
    return console_script("x-launch")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment for a child: no X_CONFIG_FILE / X_LAUNCH_*, config homes in tmp_path, no GPU."""
    environ = {k: v for k, v in os.environ.items() if k != "X_CONFIG_FILE" and not k.startswith("X_LAUNCH_")}
    environ.update(
        HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        HF_HOME=str(tmp_path / "hf"),
        CUDA_VISIBLE_DEVICES="",  # the machine has no GPU as far as the command can tell
    )
    environ.update(extra)
    return environ


def run(exe: str, tmp_path: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, env=clean_env(tmp_path, **extra_env), cwd=tmp_path, timeout=300
    )


def own_path(tmp_path: Path) -> Path:
    return tmp_path / "xdg" / "x" / "launch.yaml"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


CPU_DEFAULTS = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "NO",
    "num_machines": 1,
    "num_processes": 1,
    "machine_rank": 0,
    "rdzv_backend": "static",
    "gpu_ids": "all",
    "mixed_precision": "no",
    "use_cpu": True,
}


# --- config default ----------------------------------------------------------------------------


def test_config_default_writes_a_cpu_config_at_the_default_location(exe: str, tmp_path: Path) -> None:
    out = run(exe, tmp_path, "config", "default")
    path = own_path(tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"wrote {path}\n", "")
    assert yaml.safe_load(path.read_text()) == CPU_DEFAULTS
    loaded = load_config(path)
    assert loaded.values["use_cpu"] is True
    assert loaded.values["num_processes"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["launch.yaml"]  # no temporary file left


@pytest.mark.parametrize("option", ["--mixed_precision", "--mixed-precision"])
def test_config_default_takes_the_precision_as_accelerate_config_default_does(
    exe: str, tmp_path: Path, option: str
) -> None:
    out = run(exe, tmp_path, "config", "default", option, "bf16")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(own_path(tmp_path).read_text()) == {**CPU_DEFAULTS, "mixed_precision": "bf16"}
    shown = run(exe, tmp_path, "config", "show")
    assert any(line.strip().startswith("mixed_precision: bf16") for line in shown.stdout.splitlines()), shown.stdout


def test_config_default_refuses_an_unknown_precision(exe: str, tmp_path: Path) -> None:
    out = run(exe, tmp_path, "config", "default", "--mixed_precision", "bf32")
    assert out.returncode == 2 and not own_path(tmp_path).exists()
    assert "bf32" in out.stderr and len([line for line in out.stderr.splitlines() if line.strip()]) == 1, out.stderr


def test_config_default_refuses_to_replace_an_existing_file(exe: str, tmp_path: Path) -> None:
    assert run(exe, tmp_path, "config", "default").returncode == 0
    path = own_path(tmp_path)
    with path.open("a") as handle:
        handle.write("# tuned by hand\n")
    before = path.read_bytes()
    out = run(exe, tmp_path, "config", "default")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr == f"Error: {path} already exists; pass --force to replace it\n"
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["launch.yaml"]


def test_config_default_force_replaces(exe: str, tmp_path: Path) -> None:
    path = write(own_path(tmp_path), "num_processes: 7\nmixed_precision: bf16\n")
    out = run(exe, tmp_path, "config", "default", "--force")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"wrote {path}\n", "")
    assert yaml.safe_load(path.read_text()) == CPU_DEFAULTS


@pytest.mark.parametrize("option", ["--config_file", "--config-file"])
def test_config_default_config_file_option_chooses_the_path(exe: str, tmp_path: Path, option: str) -> None:
    target = tmp_path / "project dir" / "new" / "launch.yaml"
    out = run(exe, tmp_path, "config", "default", option, str(target))
    assert (out.returncode, out.stdout, out.stderr) == (0, f"wrote {target}\n", "")
    assert yaml.safe_load(target.read_text()) == CPU_DEFAULTS
    assert not own_path(tmp_path).exists()


def test_config_default_x_config_file_chooses_the_path(exe: str, tmp_path: Path) -> None:
    named = tmp_path / "named" / "launch.yaml"
    out = run(exe, tmp_path, "config", "default", X_CONFIG_FILE=str(named))
    assert (out.returncode, out.stdout) == (0, f"wrote {named}\n")
    assert yaml.safe_load(named.read_text()) == CPU_DEFAULTS
    assert not own_path(tmp_path).exists()


def test_config_default_flag_beats_x_config_file(exe: str, tmp_path: Path) -> None:
    named, flagged = tmp_path / "named.yaml", tmp_path / "flagged.yaml"
    out = run(exe, tmp_path, "config", "default", "--config_file", str(flagged), X_CONFIG_FILE=str(named))
    assert (out.returncode, out.stdout) == (0, f"wrote {flagged}\n")
    assert flagged.is_file()
    assert not named.exists()


def test_config_default_output_is_read_by_accelerate(exe: str, tmp_path: Path) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    assert run(exe, tmp_path, "config", "default").returncode == 0
    config = config_args.ClusterConfig.from_yaml_file(own_path(tmp_path))
    assert (config.num_processes, config.use_cpu, config.distributed_type.value) == (1, True, "NO")


# --- config show -------------------------------------------------------------------------------

SHOWN = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
fsdp_config:
  fsdp_version: 1
main_training_function: main
mixed_precision: bf16
num_processes: 2
same_network: true
"""


def test_config_show_prints_every_value_with_its_source(exe: str, tmp_path: Path) -> None:
    path = write(own_path(tmp_path), SHOWN)
    out = run(exe, tmp_path, "config", "show", X_LAUNCH_NUM_PROCESSES="4")
    assert (out.returncode, out.stderr) == (0, "")
    lines = out.stdout.splitlines()
    src = f"[config file {path}]"
    assert lines[0] == f"config file: {path} (default location)"
    for line in [
        f"  compute_environment: LOCAL_MACHINE  {src}",
        f"  distributed_type: MULTI_GPU  {src}",
        f"  mixed_precision: bf16  {src}",
        f"  debug: False  {src}",
        "  num_processes: 4  [X_LAUNCH_NUM_PROCESSES]",
        "  num_machines: 1  [default]",
        "  main_process_port: 29500  [default]",
        "  main_process_ip: -  [default]",
        f"  fsdp_config.fsdp_version: 1  {src}",
    ]:
        assert line in lines, f"{line!r} missing from:\n{out.stdout}"
    assert lines[-1] == "ignored (Accelerate features x does not offer): same_network"
    for key in SCHEMA:  # every top-level key exactly once
        assert sum(line.startswith(f"  {key}: ") for line in lines) == 1, key
    # section keys only when something set them
    assert not [line for line in lines if line.startswith("  fsdp_config.") and "fsdp_version" not in line]
    assert not [line for line in lines if line.startswith(("  deepspeed_config.", "  dynamo_config."))]


def test_config_show_section_key_from_variable(exe: str, tmp_path: Path) -> None:
    out = run(exe, tmp_path, "config", "show", X_LAUNCH_FSDP_VERSION="1", X_LAUNCH_MIXED_PRECISION="FP16")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "  fsdp_config.fsdp_version: 1  [X_LAUNCH_FSDP_VERSION]" in lines
    assert "  mixed_precision: fp16  [X_LAUNCH_MIXED_PRECISION]" in lines


def test_config_show_without_a_config_file(exe: str, tmp_path: Path) -> None:
    out = run(exe, tmp_path, "config", "show")
    assert (out.returncode, out.stderr) == (0, "")
    lines = out.stdout.splitlines()
    assert lines[0] == "config file: none (defaults only)"
    assert "  num_processes: 1  [default]" in lines
    assert "  use_cpu: False  [default]" in lines
    assert all(line.endswith("  [default]") for line in lines[1:])
    assert len(lines) == 1 + len(SCHEMA)


@pytest.mark.parametrize("where", ["accelerate", "X_CONFIG_FILE", "--config_file"])
def test_config_show_names_where_the_file_came_from(exe: str, tmp_path: Path, where: str) -> None:
    if where == "accelerate":
        path = write(tmp_path / "hf" / "accelerate" / "default_config.yaml", "num_processes: 3\n")
        out = run(exe, tmp_path, "config", "show")
        why = "Accelerate's default location"
    elif where == "X_CONFIG_FILE":
        path = write(tmp_path / "named.yaml", "num_processes: 3\n")
        out = run(exe, tmp_path, "config", "show", X_CONFIG_FILE=str(path))
        why = "X_CONFIG_FILE"
    else:
        path = write(tmp_path / "flagged.yaml", "num_processes: 3\n")
        write(own_path(tmp_path), "num_processes: 9\n")
        out = run(exe, tmp_path, "config", "show", "--config_file", str(path))
        why = "--config_file"
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"config file: {path} ({why})"
    assert f"  num_processes: 3  [config file {path}]" in lines


BROKEN = {
    "unknown-key": (
        "num_processes: 2\nnum_proceses: 2\n",
        {},
        "line 2: unknown key 'num_proceses'; did you mean 'num_processes'?",
    ),
    "bad-value": (
        "mixed_precision: fp32\n",
        {},
        "line 1: mixed_precision: 'fp32' is not valid: expected one of no, fp16, bf16, fp8",
    ),
    "malformed": ("num_processes: [2\nuse_cpu: true\n", {}, ": line 2, column 8: expected ',' or ']'"),
    "list": ("- num_processes: 2\n", {}, "must hold key: value pairs, not a list"),
    "bad-variable": (
        "num_processes: 2\n",
        {"X_LAUNCH_NUM_PROCESSES": "0"},
        "X_LAUNCH_NUM_PROCESSES: '0' is not valid: expected an integer >= 1",
    ),
    "gradient-clipping-list": (
        "deepspeed_config:\n  gradient_clipping: [1.0]\n",
        {},
        "line 2: deepspeed_config.gradient_clipping: [1.0] is not valid: expected a number >= 0",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_config_show_broken_config_is_one_line_and_exit_2(exe: str, tmp_path: Path, case: str) -> None:
    text, extra_env, fragment = BROKEN[case]
    write(own_path(tmp_path), text)
    out = run(exe, tmp_path, "config", "show", **extra_env)
    assert "Traceback" not in out.stderr
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.endswith("\n"), out.stderr
    assert out.stderr.startswith("Error: ")
    assert fragment in out.stderr


@pytest.mark.parametrize("how", ["X_CONFIG_FILE", "--config_file"])
def test_config_show_missing_named_file_is_one_line_and_exit_2(exe: str, tmp_path: Path, how: str) -> None:
    missing = tmp_path / "missing.yaml"
    if how == "X_CONFIG_FILE":
        out = run(exe, tmp_path, "config", "show", X_CONFIG_FILE=str(missing))
    else:
        out = run(exe, tmp_path, "config", "show", "--config_file", str(missing))
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == f"Error: config file {missing} does not exist; create one with: x-launch config default\n"


def test_config_path_with_spaces_works_for_show_and_env(exe: str, tmp_path: Path) -> None:
    path = write(tmp_path / "my configs" / "launch config.yaml", "num_processes: 3\nmixed_precision: bf16\n")
    show = run(exe, tmp_path, "config", "show", "--config_file", str(path))
    assert (show.returncode, show.stderr) == (0, "")
    assert show.stdout.splitlines()[0] == f"config file: {path} (--config_file)"
    assert f"  num_processes: 3  [config file {path}]" in show.stdout.splitlines()
    report = run(exe, tmp_path, "env", X_CONFIG_FILE=str(path))
    assert (report.returncode, report.stderr) == (0, "")
    assert f"- Config file: {path} (X_CONFIG_FILE)" in report.stdout.splitlines()
    assert "```yaml\nnum_processes: 3\nmixed_precision: bf16\n```" in report.stdout


# --- nothing heavy at start ---------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import sys
    from x_launch.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    else:
        code = None
    print("EXIT", code)
    print("TORCH", "torch" in sys.modules)
    """
)


def probe(tmp_path: Path, *args: str) -> tuple[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=clean_env(tmp_path), timeout=300
    )
    assert out.returncode == 0, out.stderr
    *_, exit_line, torch_line = out.stdout.splitlines()
    return exit_line, torch_line


@pytest.mark.parametrize("args", [("config", "show"), ("--help",), ("config", "--help")])
def test_show_and_help_do_not_import_torch(tmp_path: Path, args: tuple[str, ...]) -> None:
    write(own_path(tmp_path), SHOWN)
    assert probe(tmp_path, *args) == ("EXIT 0", "TORCH False")


def test_the_torch_probe_detects_an_import(tmp_path: Path) -> None:
    # `env` lists devices through torch: the probe above would see it.
    pytest.importorskip("torch")
    assert probe(tmp_path, "env") == ("EXIT 0", "TORCH True")
