"""Fresh virtual environments for the install tests: built wheels in, nothing from the repository.

``nox -s installs`` builds the five wheels and sdists into ``dist/`` and names that folder in
``X_INSTALL_DIST``; each test then makes a new venv and runs the README's install line in it.
The pinned torch (constraints/cpu.txt) is installed once per run into a folder every venv sees
through a ``.pth`` file: installing torch is most of a venv's cost (about a minute), and it is the
one thing the README assumes is there. Every other dependency is resolved by pip, in the venv,
from the wheels' own metadata, so an undeclared one fails the test.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_PIN = ROOT / "constraints" / "cpu.txt"
DIST_VARIABLE = "X_INSTALL_DIST"


@pytest.fixture(scope="session")
def dist() -> Path:
    """The folder holding the built wheels and sdists (``nox -s build`` writes ``dist/``)."""
    location = os.environ.get(DIST_VARIABLE)
    if not location:
        pytest.fail(f"{DIST_VARIABLE} is not set: run these tests with `nox -s installs`, which builds dist/ first")
    folder = Path(location).resolve()
    if not list(folder.glob("x_common-*.whl")):
        pytest.fail(f"{folder} holds no x_common wheel: build it with `nox -s build`")
    return folder


def _pip_env() -> dict[str, str]:
    # The torch pin travels as PIP_CONSTRAINT so that the command run is the README's, word for word.
    # No byte-compiling: for torch and transformers it is a large part of the install time, and
    # these venvs live for one test.
    return {**os.environ, "PIP_CONSTRAINT": str(CPU_PIN), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_COMPILE": "1"}


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Room for the torch folder and the venvs, removed at the end: together they take over 1 GB."""
    folder = tmp_path_factory.mktemp("installs")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def torch_layer(scratch: Path) -> Path:
    """The pinned torch and its own dependencies, installed once with --target."""
    target = scratch / "torch-layer"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "torch"]
    out = subprocess.run(command, env=_pip_env(), capture_output=True, text=True)
    assert out.returncode == 0, f"installing the pinned torch failed:\n{out.stderr[-3000:]}"
    return target


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return {**environ, "PATH": f"{self.bin}{os.pathsep}{environ.get('PATH', '')}", **extra}

    def run_readme_line(self, line: str, *, cwd: Path) -> subprocess.CompletedProcess[str]:
        """Run a README command (``pip install ...``) with this venv's pip."""
        words = shlex.split(line)
        assert words[0] == "pip", f"not a pip command: {line}"
        return subprocess.run(
            self.pip(*words[1:]), cwd=cwd, env={**self.env(), **_pip_env()}, capture_output=True, text=True
        )

    def pip(self, *args: str) -> list[str]:
        # This pip, installing into the venv (pip --python): what `pip` in the venv would do, without
        # seeding every venv with its own pip first.
        return [sys.executable, "-m", "pip", "--python", str(self.bin / "python"), *args]

    def run(self, *command: str, cwd: Path, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
        program = self.bin / command[0]
        return subprocess.run(
            [str(program), *command[1:]],
            cwd=cwd,
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def x_distributions(self) -> set[str]:
        listing = subprocess.run(self.pip("list", "--format", "freeze"), capture_output=True, text=True, check=True)
        names = {line.split("==")[0].lower() for line in listing.stdout.splitlines() if "==" in line}
        return {n for n in names if n.startswith("x-")}


@pytest.fixture
def fresh_venv(scratch: Path, torch_layer: Path, request: pytest.FixtureRequest) -> Venv:
    """A new venv (the test's name) that sees the pinned torch and nothing else."""
    path = scratch / request.node.name.replace("[", "-").replace("]", "")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True)
    purelib = sysconfig.get_path("purelib", vars={"base": str(path), "platbase": str(path)})
    Path(purelib, "pinned-torch.pth").write_text(f"{torch_layer}\n")
    return Venv(path)
