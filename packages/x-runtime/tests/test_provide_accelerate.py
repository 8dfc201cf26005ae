"""x serves the ``accelerate`` import: opt-in, beside or without the real package, names by table.

Each case runs in a fresh interpreter (the serving is decided at interpreter start, by x-common's
``.pth`` line, or by ``provide_accelerate()`` before the first import). The real Accelerate is
installed in this test session, so "served" is told apart from "imported the real one" by the
module's type and file.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import x_runtime
from x_common.accelerate_import import ACCELERATE_API

REAL = importlib.metadata.version("accelerate")  # the real package, installed beside x in this session


def python(code: str, *, serve: str | None = "1", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_PROVIDE", "RANK", "LOCAL_RANK", "WORLD"))}
    if serve is not None:
        environ["X_PROVIDE_ACCELERATE"] = serve
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environ, timeout=timeout
    )


def test_the_environment_variable_serves_accelerate_beside_the_real_one() -> None:
    done = python(
        """
        import importlib.metadata, importlib.util
        import accelerate, accelerate.utils
        print(type(accelerate).__name__, accelerate.__version__, importlib.metadata.version("accelerate"))
        print(accelerate.Accelerator.__module__, accelerate.utils.gather.__module__)
        print(importlib.util.find_spec("accelerate.utils") is not None)
        """
    )
    assert done.returncode == 0, done.stderr
    kind, version, metadata = done.stdout.splitlines()[0].split()
    assert (kind, version, metadata) == ("ServedModule", ACCELERATE_API, ACCELERATE_API)
    assert done.stdout.splitlines()[1:] == ["x_runtime.accelerator.facade x_runtime.process.collectives", "True"]
    # One line on stderr, naming both versions and the real package it leaves alone.
    assert done.stderr.splitlines() == [
        f"x-runtime: accelerate is served by x-runtime {x_runtime.__version__} (Accelerate {ACCELERATE_API}'s API); "
        f"the real Accelerate {REAL} installed here is not used"
    ]


@pytest.mark.parametrize("serve", [None, "0", ""])
def test_without_opt_in_the_real_accelerate_is_imported(serve: str | None) -> None:
    done = python(
        """
        import sys, accelerate
        from x_common.accelerate_import import installed
        print(accelerate.__file__, installed(), type(accelerate).__name__)
        """,
        serve=serve,
    )
    assert done.returncode == 0, done.stderr
    path, installed, kind = done.stdout.split()
    assert "site-packages" in path and installed == "False" and kind == "module"
    assert "served" not in done.stderr


def test_a_malformed_value_is_one_line_and_serves_nothing() -> None:
    done = python("import accelerate; print(type(accelerate).__name__)", serve="maybe")
    assert done.returncode == 0 and done.stdout.strip() == "module"
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "X_PROVIDE_ACCELERATE" in lines[0] and lines[0].endswith("accelerate is not served by x")


def test_provide_accelerate_in_the_script() -> None:
    done = python(
        """
        import x_runtime
        x_runtime.provide_accelerate()
        x_runtime.provide_accelerate()  # twice is once
        import sys, accelerate
        from x_common.accelerate_import import AccelerateFinder
        print(type(accelerate).__name__, sum(isinstance(f, AccelerateFinder) for f in sys.meta_path))
        """,
        serve=None,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ServedModule", "1"]


def test_provide_accelerate_after_the_real_import_is_refused() -> None:
    done = python(
        """
        import accelerate, x_runtime
        try:
            x_runtime.provide_accelerate()
        except RuntimeError as exc:
            print(exc)
        """,
        serve=None,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("the real Accelerate was imported already (from ")
    assert "call x_runtime.provide_accelerate() before anything imports accelerate" in done.stdout


def test_a_name_x_lacks_raises_an_import_error_naming_x() -> None:
    done = python(
        """
        import accelerate.utils
        try:
            from accelerate.utils import MegatronLMPlugin
        except ImportError as exc:
            print("import:", exc)
        print("hasattr:", hasattr(accelerate.utils, "MegatronLMPlugin"))
        try:
            accelerate.utils.MegatronLMPlugin
        except AttributeError as exc:
            print("attribute:", type(exc).__name__)
        try:
            import accelerate.utils.megatron_lm
        except ModuleNotFoundError as exc:
            print("module:", exc)
        """
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["import"].startswith(
        f"x-runtime {x_runtime.__version__} serves accelerate ({ACCELERATE_API}'s API) but has no "
        "accelerate.utils.MegatronLMPlugin; what x leaves out and why: https://github.com/x-project/x/blob/main/docs/ecosystem.md"
    )
    assert lines["hasattr"] == "False" and lines["attribute"] == "AttributeError"
    assert lines["module"].startswith(
        "x-runtime serves accelerate (1.15.0's API) but not its module accelerate.utils.megatron_lm"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("x_bigmodel") is not None, reason="x-bigmodel is installed: its names are served"
)
def test_a_name_of_an_x_package_not_installed_names_the_package() -> None:
    done = python(
        """
        try:
            from accelerate import init_empty_weights
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "accelerate.init_empty_weights is served by x-bigmodel, which is not installed here: pip install x-bigmodel"
    )


def test_assignments_on_a_served_module_reach_x() -> None:
    done = python(
        """
        import accelerate.utils, x_runtime
        original = x_runtime.gather
        def patched(tensor):
            return "patched"
        accelerate.utils.gather = patched
        import accelerate.utils.operations as operations
        print(x_runtime.gather is patched, operations.gather is patched, accelerate.utils.gather("t"))
        accelerate.utils.gather = original
        print(x_runtime.gather is original)
        accelerate.utils.mine = 3  # a name the table does not serve stays on the served module
        print(accelerate.utils.mine)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "patched", "True", "3"]


def test_star_import_and_dir_list_the_served_names() -> None:
    done = python(
        """
        import accelerate.utils
        from accelerate.utils import *
        print(callable(gather), "gather" in dir(accelerate.utils), "MegatronLMPlugin" in dir(accelerate.utils))
        print(repr(accelerate.utils).startswith("<module 'accelerate.utils' (served by x-runtime"))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False", "True"]


def test_installers_see_only_what_is_installed() -> None:
    """pip asks one folder at a time: it keeps seeing the real Accelerate (or none), never the served one."""
    done = python(
        """
        import importlib.metadata, sys
        site = [p for p in sys.path if p.endswith("site-packages")]
        found = [d.metadata["Summary"] or "" for d in importlib.metadata.distributions(path=site)
                 if d.metadata["Name"].lower() == "accelerate"]
        print(len(found), any("x-runtime" in s for s in found))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]


def test_rank_zero_alone_says_it_once(tmp_path: Path) -> None:
    script = tmp_path / "imports.py"
    script.write_text("import accelerate\nprint('served' if type(accelerate).__name__ == 'ServedModule' else 'real')\n")
    environ = {**os.environ, "X_PROVIDE_ACCELERATE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", str(script)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["served", "served"]
    assert (done.stdout + done.stderr).count("accelerate is served by x-runtime") == 1
