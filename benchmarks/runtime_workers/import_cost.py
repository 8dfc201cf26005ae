"""The import row of bench_runtime.py: CPU time of fresh interpreters importing each library, and
what `import x_runtime` loads beyond torch (`-X importtime`)."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from collections.abc import Callable

IMPORTS = {"plain": "import torch", "accelerate": "import accelerate", "x": "import x_runtime"}


def import_cpu_seconds(statement: str, env: dict[str, str]) -> float:
    """User + sys CPU seconds of a fresh interpreter running ``statement``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"`{statement}` failed:\n{proc.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
    compile_x_sources()
    if warm:  # the file cache, so that the first timed import does not pay for it
        import_cpu_seconds("; ".join(IMPORTS[v] for v in variants), env)
    return [{v: import_cpu_seconds(IMPORTS[v], env) for v in order(variants, r)} for r in range(repeat)]


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
