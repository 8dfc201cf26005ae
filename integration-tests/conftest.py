"""A real SLURM cluster for the tests marked ``requires_slurm``; a clean environment for the
processes tests start.

When such a test is collected and no SLURM answers, the local test cluster from
``../shared/slurm`` (beside the repository) is started with two nodes on this host, before any
test runs: the root conftest decides the ``requires_slurm`` skip at set-up time, from a cached
``sinfo`` check that is cleared here once the cluster is up. It is started only as root and only
when the script exists; it is stopped at the end of the session only if this session started it.
If it cannot start, those tests are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from x_common import env

# Helper modules beside the tests (process_tree) import by name: pytest runs with
# --import-mode=importlib, which puts no test folder on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SLURM_SCRIPTS = Path(__file__).resolve().parents[1].parent / "shared" / "slurm"
NODES = 2
_STARTED = pytest.StashKey[bool]()


def _clear_slurm_cache(config: pytest.Config) -> None:
    for plugin in config.pluginmanager.get_plugins():
        check = getattr(plugin, "_slurm_problem", None)
        if check is not None and hasattr(check, "cache_clear"):
            check.cache_clear()


def slurm_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and any(s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in out.stdout.split())


def _start_cluster() -> str | None:
    """Start the local cluster; the reason it could not, or None."""
    script = SLURM_SCRIPTS / "start-local-slurm.sh"
    if not script.is_file():
        return f"no SLURM here and no {script} to start one"
    if os.geteuid() != 0:
        return f"no SLURM here, and {script.name} needs root"
    environ = {**os.environ, "SLURM_LOCAL_NODES": str(NODES)}
    try:
        out = subprocess.run(["bash", str(script)], env=environ, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return f"{script.name} did not finish within 300 s"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{script.name} failed (exit {out.returncode}): {last}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = [item for item in items if item.get_closest_marker("requires_slurm") is not None]
    if not wanted or slurm_answers():
        return
    problem = _start_cluster()
    if problem is None:
        config.stash[_STARTED] = True
        _clear_slurm_cache(config)
        return
    for item in wanted:
        item.add_marker(pytest.mark.skip(reason=f"could not start the local SLURM cluster: {problem}"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_STARTED, False):
        subprocess.run(["bash", str(SLURM_SCRIPTS / "stop-local-slurm.sh")], capture_output=True, timeout=120)


def _launch_env(root: Path) -> dict[str, str]:
    names = (env.PREFIX, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_", "SLURM_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith((*names, "TORCHELASTIC_"))}
    clean.update(
        HOME=str(root / "home"),
        XDG_CONFIG_HOME=str(root / "cfg"),
        XDG_CACHE_HOME=str(root / "cache"),
        HF_HOME=str(root / "hf"),
        OMP_NUM_THREADS="1",
    )
    return clean


@pytest.fixture(scope="session")
def launch_env() -> Callable[[Path], dict[str, str]]:
    """``launch_env(root)``: this environment without launcher, rank or SLURM variables, every
    home and config folder under ``root``, one thread per process."""
    return _launch_env
