"""The import row of bench_runtime.py: CPU time of `import torch` and of each library's import beyond it
in fresh interpreters, and what `import x_runtime` loads beyond torch (`-X importtime`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable

IMPORTS = {"accelerate": "accelerate", "x": "x_runtime"}

# Run in a fresh interpreter: CPU time of `import torch`, then of the library's import beyond it.
SPLIT = """
import json, sys, time
start = time.process_time()
import torch
middle = time.process_time()
__import__(sys.argv[1])
print(json.dumps([middle - start, time.process_time() - middle]))
"""


def import_split(module: str, env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds of `import torch` and of `import module` after it, in one fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", SPLIT, module], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"`import {module}` failed:\n{proc.stderr[-3000:]}")
    torch_s, beyond_s = json.loads(proc.stdout.splitlines()[-1])
    return torch_s, beyond_s


def compile_x_sources() -> None:
    """Bytecode for x's own packages, as a wheel install leaves it (see bench_runtime.py's docstring)."""
    import compileall
    import importlib.util

    for name in ("x_common", "x_runtime"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=1)


def measure_imports(
    variants: list[str], repeat: int, warm: bool, env: dict[str, str], order: Callable[[list[str], int], list[str]]
) -> list[dict[str, float]]:
    """One round per library and repeat: {"plain": its interpreter's `import torch`, library: that plus the
    library's import beyond torch}, so each ratio compares two parts of one process (see bench_runtime.py)."""
    compile_x_sources()
    libraries = [v for v in variants if v in IMPORTS]
    if warm:  # the file cache, so that the first timed import does not pay for it
        for library in libraries:
            import_split(IMPORTS[library], env)
    rounds = []
    for r in range(repeat):
        for library in order(libraries, r):
            torch_s, beyond_s = import_split(IMPORTS[library], env)
            rounds.append({"plain": torch_s, library: torch_s + beyond_s})
    return rounds


def imported_beyond_torch(env: dict[str, str]) -> list[tuple[str, float]]:
    """Top-level packages that `import x_runtime` loads after `import torch`, with their self time (s)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import torch; import x_runtime"],
        capture_output=True,
        text=True,
        env=env,
    )
    pattern = re.compile(r"import time:\s+(\d+) \|\s+\d+ \| *(\S+)")
    lines = [m for m in map(pattern.match, proc.stderr.splitlines()) if m]
    # -X importtime prints a package after its children: everything after torch's own line is x_runtime's.
    last_torch = max((i for i, m in enumerate(lines) if m.group(2) == "torch"), default=None)
    if proc.returncode != 0 or last_torch is None:
        return []
    totals: dict[str, float] = {}
    for m in lines[last_torch + 1 :]:
        top = m.group(2).split(".")[0]
        totals[top] = totals.get(top, 0.0) + int(m.group(1)) / 1e6
    return sorted(totals.items(), key=lambda item: -item[1])
