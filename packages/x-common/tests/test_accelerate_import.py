"""Serving ``import accelerate`` from x: the ``.pth`` line, the finder, the served metadata, the opt-in.

Everything here runs without x-runtime (x-common's tests have only accelerate and torch beside
it): where the finder would import x-runtime, the provider's name is pointed at a module that
does not exist. Each test leaves ``sys.meta_path`` as it found it.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from x_common import accelerate_import
from x_common.accelerate_import import (
    ACCELERATE_API,
    AccelerateFinder,
    ServedDistribution,
    install,
    install_from_environment,
    installed,
    is_served,
)
from x_common.dtypes import dtype_bits, dtype_byte_size, dtype_name
from x_common.env import PROVIDE_ACCELERATE

PTH = Path(__file__).resolve().parents[1] / "src" / "x_common_accelerate.pth"
MISSING_RUNTIME = "x_runtime_missing_for_test"


@pytest.fixture(autouse=True)
def _meta_path_without_the_finder(monkeypatch) -> None:
    """Each test starts with no AccelerateFinder installed; whatever it installs goes when it ends."""
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, AccelerateFinder)])
    monkeypatch.setattr(accelerate_import, "_said", [])  # the once-per-process stderr line, fresh per test
    monkeypatch.delenv(PROVIDE_ACCELERATE.name, raising=False)


def _finders() -> list[AccelerateFinder]:
    return [f for f in sys.meta_path if isinstance(f, AccelerateFinder)]


# --- the .pth line -----------------------------------------------------------------------------


def test_the_pth_file_is_one_line_reading_the_provide_accelerate_variable() -> None:
    text = PTH.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) == 1 and text in (lines[0], lines[0] + "\n")
    line = lines[0]
    # site.py executes a .pth line only when it starts with "import" (followed by a space or tab)
    assert line.startswith("import os;")
    assert re.findall(r"os\.environ\.get\(\"([^\"]+)\"\)", line) == [PROVIDE_ACCELERATE.name]
    assert PROVIDE_ACCELERATE.name == "X_PROVIDE_ACCELERATE"
    assert "accelerate_import" in line and line.endswith(".install_from_environment()")


def _start(value: str | None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != PROVIDE_ACCELERATE.name}
    if value is not None:
        environ[PROVIDE_ACCELERATE.name] = value
    code = textwrap.dedent(
        """
        import sys
        print(sum(type(f).__name__ == "AccelerateFinder" for f in sys.meta_path), "torch" in sys.modules)
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=60)


def test_the_installed_pth_line_runs_at_interpreter_start() -> None:
    # The .pth x-common installs in site-packages: the finder is there (once) at start only when asked,
    # and the start imports no torch.
    assert [_start(v).stdout.split() for v in ("1", "true", None, "0")] == [
        ["1", "False"],
        ["1", "False"],
        ["0", "False"],
        ["0", "False"],
    ]
    malformed = _start("maybe")
    assert malformed.returncode == 0 and malformed.stdout.split() == ["0", "False"]
    assert malformed.stderr.splitlines() == [
        "x-common: X_PROVIDE_ACCELERATE='maybe' is not valid: expected a boolean (1, true, yes, on or 0, false, "
        "no, off); accelerate is not served by x"
    ]


# --- the finder without x-runtime ----------------------------------------------------------------


@pytest.mark.parametrize("fullname", ["accelerate", "accelerate.utils", "accelerate.utils.dataclasses"])
def test_finder_without_x_runtime_says_how_to_fix_it(fullname: str, monkeypatch) -> None:
    monkeypatch.setattr(accelerate_import, "PROVIDER", MISSING_RUNTIME)
    with pytest.raises(ModuleNotFoundError) as excinfo:
        AccelerateFinder().find_spec(fullname)
    assert str(excinfo.value) == (
        f"{fullname} is served by x-runtime here (X_PROVIDE_ACCELERATE is set), and x-runtime is not installed: "
        "pip install x-runtime, or unset X_PROVIDE_ACCELERATE"
    )
    assert excinfo.value.name == fullname
    assert excinfo.value.__suppress_context__ and excinfo.value.__cause__ is None


def test_import_through_the_installed_finder_without_x_runtime(monkeypatch) -> None:
    monkeypatch.setattr(accelerate_import, "PROVIDER", MISSING_RUNTIME)
    for name in [n for n in sys.modules if is_served(n)]:
        monkeypatch.delitem(sys.modules, name)  # put back when the test ends
    assert install()
    with pytest.raises(ModuleNotFoundError, match=r"^accelerate is served by x-runtime here .* pip install x-runtime"):
        importlib.import_module("accelerate")


def test_finder_reraises_a_missing_module_that_is_not_x_runtime(monkeypatch) -> None:
    # A module x-runtime itself lacks (a broken install) is not "x-runtime is not installed".
    monkeypatch.setattr(accelerate_import, "PROVIDER", "some_other_missing_module_for_test")
    with pytest.raises(ModuleNotFoundError) as excinfo:
        AccelerateFinder().find_spec("accelerate")
    assert excinfo.value.name == "some_other_missing_module_for_test"
    assert str(excinfo.value) == "No module named 'some_other_missing_module_for_test'"


@pytest.mark.parametrize("fullname", ["accelerated", "torch", "accelerate_x", "x_runtime", "Accelerate"])
def test_finder_ignores_other_names_without_importing_the_provider(fullname: str, monkeypatch) -> None:
    monkeypatch.setattr(accelerate_import, "PROVIDER", MISSING_RUNTIME)
    assert AccelerateFinder().find_spec(fullname) is None


# --- the served distribution ---------------------------------------------------------------------


def test_served_distribution_metadata() -> None:
    dist = ServedDistribution()
    assert dist.version == ACCELERATE_API == "1.15.0"
    assert dist.metadata["Name"] == "accelerate" and dist.name == "accelerate"
    summary = dist.metadata["Summary"]
    assert "x-runtime" in summary and "not the real Accelerate" in summary and ACCELERATE_API in summary
    assert dist.read_text("top_level.txt") == "accelerate\n"
    assert dist.files is None and dist.requires is None  # nothing of it is on disk


@pytest.mark.parametrize("name", ["accelerate", "Accelerate", "ACCELERATE", None])
def test_find_distributions_answers_for_accelerate_on_sys_path(name: str | None) -> None:
    context = importlib.metadata.DistributionFinder.Context(name=name)
    assert context.path is sys.path
    found = list(AccelerateFinder().find_distributions(context))
    assert [(type(d), d.version) for d in found] == [(ServedDistribution, ACCELERATE_API)]
    assert [d.version for d in AccelerateFinder().find_distributions()] == [ACCELERATE_API]  # no context: all


@pytest.mark.parametrize("name", ["torch", "accelerated", "x-runtime", "accelerate-x"])
def test_find_distributions_ignores_other_names(name: str) -> None:
    context = importlib.metadata.DistributionFinder.Context(name=name)
    assert list(AccelerateFinder().find_distributions(context)) == []


@pytest.mark.parametrize("path", [["/nonexistent/site-packages"], "copy of sys.path", []])
def test_find_distributions_ignores_an_explicit_path_as_pip_asks(path) -> None:
    paths = list(sys.path) if path == "copy of sys.path" else path
    context = importlib.metadata.DistributionFinder.Context(name="accelerate", path=paths)
    assert list(AccelerateFinder().find_distributions(context)) == []


def test_installed_finder_answers_importlib_metadata_but_not_per_folder_queries() -> None:
    assert install()
    assert importlib.metadata.version("accelerate") == ACCELERATE_API
    assert importlib.metadata.version("Accelerate") == ACCELERATE_API
    assert "x-runtime" in importlib.metadata.metadata("accelerate")["Summary"]
    # an installer's question, one folder at a time: only what is on disk there
    folder = [str(Path(importlib.metadata.__file__).parent)]
    assert list(importlib.metadata.distributions(name="accelerate", path=folder)) == []


def test_install_twice_puts_one_finder_first() -> None:
    assert installed() is False and _finders() == []
    assert install() is True
    assert install() is False
    assert len(_finders()) == 1 and isinstance(sys.meta_path[0], AccelerateFinder)
    assert installed() is True


# --- install_from_environment ------------------------------------------------------------------


def test_install_from_environment_malformed_says_one_line_even_twice(capsys) -> None:
    environ = {PROVIDE_ACCELERATE.name: "maybe"}
    assert install_from_environment(environ) is False
    assert install_from_environment(environ) is False  # a venv's lib64 link runs the .pth line twice
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "x-common: X_PROVIDE_ACCELERATE='maybe' is not valid: expected a boolean (1, true, yes, on or 0, false, "
        "no, off); accelerate is not served by x"
    ]
    assert installed() is False


@pytest.mark.parametrize(
    "value, serves", [("1", True), ("true", True), ("yes", True), ("0", False), ("false", False), (None, False)]
)
def test_install_from_environment_installs_only_when_asked(value: str | None, serves: bool, capsys) -> None:
    environ = {} if value is None else {PROVIDE_ACCELERATE.name: value}
    assert install_from_environment(environ) is serves
    assert installed() is serves and len(_finders()) == int(serves)
    assert install_from_environment(environ) is False  # twice is once
    assert len(_finders()) == int(serves)
    assert capsys.readouterr().err == ""


def test_install_from_environment_reads_the_process_environment(monkeypatch) -> None:
    assert install_from_environment() is False and not installed()
    monkeypatch.setenv(PROVIDE_ACCELERATE.name, "1")
    assert install_from_environment() is True and installed()


# --- is_served ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fullname, served",
    [
        ("accelerate", True),
        ("accelerate.utils", True),
        ("accelerate.utils.dataclasses", True),
        ("accelerated", False),
        ("accelerate_x", False),
        ("x_accelerate", False),
        ("Accelerate", False),  # module names are case-sensitive
        ("", False),
    ],
)
def test_is_served(fullname: str, served: bool) -> None:
    assert is_served(fullname) is served


# --- dtype_name and enums ----------------------------------------------------------------------


def test_dtype_name_accepts_an_enum_whose_value_is_a_dtype_name() -> None:
    Kind = enum.Enum("Kind", {"BF": "bfloat16", "HALF": "torch.half", "INT4": "int4", "BAD": "float7", "NUM": 16})
    assert dtype_name(Kind.BF) == "bfloat16" and dtype_name(Kind.HALF) == "float16"
    assert dtype_name(Kind.INT4) == "int4" and dtype_bits(Kind.INT4) == 4
    with pytest.raises(ValueError, match="unknown dtype 'float7'"):
        dtype_name(Kind.BAD)
    with pytest.raises(ValueError, match="invalid dtype"):
        dtype_name(Kind.NUM)


def test_accelerates_custom_dtypes_have_accelerates_sizes() -> None:
    pytest.importorskip("torch")
    modeling = pytest.importorskip("accelerate.utils.modeling")
    from accelerate.utils import CustomDtype

    assert {m.name: dtype_name(m) for m in CustomDtype} == {m.name: m.value for m in CustomDtype}
    assert {m.name: dtype_byte_size(m) for m in CustomDtype} == {
        m.name: modeling.dtype_byte_size(m) for m in CustomDtype
    }
