"""Every ``accelerate`` name transformers, TRL and PEFT import is served by x.

The installed libraries' sources are read with ``ast`` (every ``from accelerate... import name``
and ``import accelerate.module``, inside functions too); a fresh interpreter serving accelerate
from x imports each. A missing name would stop a library's import (one name missing from
``accelerate.utils.modeling`` stops every transformers model class), so none may be missing.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LIBRARIES = ("transformers", "trl", "peft")


def _imports(folder: Path) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in folder.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module == "accelerate" or node.module.startswith("accelerate."):
                    found.update((node.module, alias.name) for alias in node.names if alias.name != "*")
            elif isinstance(node, ast.Import):
                found.update((alias.name, "") for alias in node.names if alias.name.startswith("accelerate."))
    return found


def test_every_name_the_libraries_import_is_served() -> None:
    wanted: set[tuple[str, str]] = set()
    for library in LIBRARIES:
        spec = importlib.util.find_spec(library)
        assert spec is not None and spec.submodule_search_locations, f"{library} is not installed in this session"
        wanted |= _imports(Path(next(iter(spec.submodule_search_locations))))
    assert len(wanted) > 50, f"only {len(wanted)} imports found: the scan is broken"
    check = (
        "import importlib, json, sys\n"
        "missing = []\n"
        "for module, name in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        served = importlib.import_module(module)\n"
        "        if name:\n"
        "            getattr(served, name)\n"
        "    except Exception as exc:\n"
        "        missing.append(f'{module}.{name}: {type(exc).__name__}: {exc}')\n"
        "print(json.dumps(missing))\n"
    )
    environ = {**os.environ, "X_PROVIDE_ACCELERATE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", check, json.dumps(sorted(wanted))],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    missing = json.loads(done.stdout.splitlines()[-1])
    assert not missing, f"{len(missing)} of {len(wanted)} names the libraries import are not served:\n" + "\n".join(
        missing
    )


@pytest.mark.parametrize("library", ["transformers", "trl", "peft"])
def test_each_library_imports_with_x_serving_accelerate(library: str) -> None:
    code = f"import {library}, accelerate; print(type(accelerate).__name__)"
    if library == "transformers":
        code = "from transformers import Trainer, LlamaForCausalLM; import accelerate; print(type(accelerate).__name__)"
    elif library == "trl":
        code = "from trl import SFTTrainer, DPOTrainer; import accelerate; print(type(accelerate).__name__)"
    environ = {**os.environ, "X_PROVIDE_ACCELERATE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "ServedModule"
