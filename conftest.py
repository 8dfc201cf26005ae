"""Hardware markers shared by every package's tests and the integration tests.

    @pytest.mark.requires_cuda(2)   # at least 2 CUDA devices
    @pytest.mark.requires_tpu       # a TPU through torch_xla
    @pytest.mark.requires_slurm     # a running SLURM cluster (sinfo answers)
    @pytest.mark.requires_netns     # root may make network namespaces (integration-tests/netns.py)
    @pytest.mark.slow               # long; skipped with --skip-slow

A test whose hardware is absent is skipped with the reason, so the same command runs on a
laptop, a CI runner and a GPU box; the GPU and TPU nox sessions select these markers.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

MARKERS = {
    "requires_cuda(n=1)": "needs at least n CUDA devices",
    "requires_tpu": "needs a TPU reachable through torch_xla",
    "requires_slurm": "needs a running SLURM cluster (sinfo, srun, sbatch)",
    "requires_netns": "needs network namespaces as hosts: root and iproute2 (integration-tests/netns.py)",
    "slow": "takes long; deselect with --skip-slow",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skip-slow", action="store_true", help="skip tests marked slow")


def pytest_configure(config: pytest.Config) -> None:
    for signature, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{signature}: {meaning}")


@functools.cache
def _cuda_count() -> int:
    from x_common.devices import device_count

    return device_count("cuda")


@functools.cache
def _tpu_count() -> int:
    from x_common import env
    from x_common.devices import device_count

    return device_count("xla") if env.PJRT_DEVICE.read() in (None, "TPU") else 0


@functools.cache
def _slurm_problem() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("srun") is None:
        return "SLURM is not installed (no sinfo/srun on PATH)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 10 s"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in states):
        return f"no SLURM node is up (sinfo: {(out.stdout + out.stderr).strip() or 'no output'})"
    return None


@functools.cache
def _netns_problem() -> str | None:
    # The check lives beside the hosts it guards; loaded by path, as no test folder is on sys.path.
    path = Path(__file__).parent / "integration-tests" / "netns.py"
    spec = importlib.util.spec_from_file_location("_x_netns_check", path)
    if spec is None or spec.loader is None:
        return f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module.netns_problem()


def hardware_skip_reason(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run on this machine, or ``None`` when it can."""
    cuda = item.get_closest_marker("requires_cuda")
    if cuda is not None:
        wanted = int(cuda.args[0]) if cuda.args else int(cuda.kwargs.get("n", 1))
        have = _cuda_count()
        if have < wanted:
            return f"needs {wanted} CUDA device(s), found {have}"
    if item.get_closest_marker("requires_tpu") is not None and _tpu_count() == 0:
        return "needs a TPU through torch_xla, found none"
    if item.get_closest_marker("requires_slurm") is not None:
        problem = _slurm_problem()
        if problem is not None:
            return problem
    if item.get_closest_marker("requires_netns") is not None:
        problem = _netns_problem()
        if problem is not None:
            return problem
    if item.get_closest_marker("slow") is not None and item.config.getoption("--skip-slow"):
        return "slow test skipped by --skip-slow"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = hardware_skip_reason(item)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def console_script() -> Callable[[str], str]:
    """Path of an installed console script next to the running interpreter (fails if absent)."""

    def find(name: str) -> str:
        path = shutil.which(name, path=os.path.dirname(sys.executable))
        assert path is not None, f"console script {name} is not installed next to {sys.executable}"
        return path

    return find
