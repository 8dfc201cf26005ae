"""The installed ``x-launch`` console script: version, help, errors, and a fast start."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import x_launch


@pytest.fixture(scope="module")
def exe(console_script) -> str:
    return console_script("x-launch")


def test_version_matches_distribution_metadata(exe: str) -> None:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"x-launch, version {importlib.metadata.version('x-launch')}"
    assert x_launch.__version__ == importlib.metadata.version("x-launch")


def test_help_shows_usage_and_example(exe: str) -> None:
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("Usage: x-launch")
    assert "x-launch --version" in out.stdout


def test_unknown_command_is_one_clear_error_without_traceback(exe: str) -> None:
    out = subprocess.run([exe, "lanch"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "No such command 'lanch'" in out.stderr
    assert "Traceback" not in out.stderr


def test_start_up_imports_no_torch() -> None:
    # Login nodes are slow; --help must not pay for importing torch.
    code = "import sys, x_launch.cli.command_line; sys.exit('torch imported' if 'torch' in sys.modules else 0)"
    subprocess.run([sys.executable, "-c", code], check=True)
