"""`x-launch env`: versions, platform, devices, memory and the config file, for a bug report."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def exe(console_script) -> str:
    return console_script("x-launch")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "X_CONFIG_FILE" and not k.startswith("X_LAUNCH_")}
    environ.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "xdg"), HF_HOME=str(tmp_path / "hf"))
    environ.update(extra)
    return environ


def run_env(exe: str, tmp_path: Path, *args: str, **extra_env: str) -> list[str]:
    out = subprocess.run(
        [exe, "env", *args], capture_output=True, text=True, env=clean_env(tmp_path, **extra_env), timeout=300
    )
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    return out.stdout.splitlines()


CONFIG_TEXT = """\
# written by hand
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: bf16
num_processes: 2
"""


def test_env_reports_versions_devices_memory_and_the_config(exe: str, tmp_path: Path) -> None:
    path = tmp_path / "xdg" / "x" / "launch.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(CONFIG_TEXT)
    lines = run_env(exe, tmp_path)
    text = "\n".join(lines)
    assert lines[0] == "x-launch environment"
    python = next(line for line in lines if line.startswith("- Python: "))
    assert python.startswith(f"- Python: {sys.version.split()[0]} (")
    assert f"- x-launch: {importlib.metadata.version('x-launch')}" in lines
    assert f"- x-common: {importlib.metadata.version('x-common')}" in lines
    assert f"- torch: {importlib.metadata.version('torch')}" in lines
    assert "- deepspeed: " in text  # listed even when absent ("not installed")
    assert any(line.startswith("- Platform: ") for line in lines)
    assert re.search(r"^- Host RAM: \d+(\.\d+)? [KMGT]i?B usable, ", text, re.MULTILINE), text
    assert re.search(r"^- Device cpu:0: .+, .+ free of \d+(\.\d+)? [KMGT]i?B$", text, re.MULTILINE), text
    assert f"- Config file: {path} (default location)" in lines
    assert text.endswith("```yaml\n" + CONFIG_TEXT.rstrip() + "\n```")


def test_env_without_a_config_says_none(exe: str, tmp_path: Path) -> None:
    lines = run_env(exe, tmp_path)
    assert "- Config file: none (x-launch config default writes one)" in lines
    assert "```yaml" not in lines


def test_env_shows_accelerates_config_when_it_is_the_one_in_use(exe: str, tmp_path: Path) -> None:
    path = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text('{\n  "num_processes": 1,\n  "use_cpu": true\n}\n')
    lines = run_env(exe, tmp_path)
    assert f"- Config file: {path} (Accelerate's default location)" in lines
    assert "\n".join(lines).endswith('```yaml\n{\n  "num_processes": 1,\n  "use_cpu": true\n}\n```')


def test_env_still_reports_when_the_config_is_broken(exe: str, tmp_path: Path) -> None:
    # A bug report is most needed when the config is wrong: env prints it rather than failing.
    path = tmp_path / "broken.yaml"
    path.write_text("num_proceses: [2\n")
    lines = run_env(exe, tmp_path, "--config_file", str(path))
    assert f"- Config file: {path} (--config_file)" in lines
    assert "\n".join(lines).endswith("```yaml\nnum_proceses: [2\n```")


def test_env_with_a_missing_named_config_says_it_cannot_read_it(exe: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    lines = run_env(exe, tmp_path, X_CONFIG_FILE=str(missing))
    assert f"- Config file: {missing} (X_CONFIG_FILE)" in lines
    assert "(cannot read: No such file or directory)" in lines
