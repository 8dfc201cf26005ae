"""``x-launch migrate`` writes only imports that work: every public Accelerate name, migrated and run.

x-launch installs alone, so it carries the lists of what each x package exports
(``x_launch.migrate.x_names``); here, with every package installed, the lists must equal the packages' own
``__all__``, and each public name of Accelerate's user-facing modules (Accelerate 1.15, installed
beside the tests) is migrated as ``from <module> import <name>`` and the result executed: it
imports from x when x has the name, and stays on Accelerate, with a note, when x has not. The names
that stay are the table of docs/compatibility.md ("Names that stay on Accelerate"), row for row.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import x_bigmodel
import x_launch
import x_runtime
from x_launch.migrate import x_names
from x_launch.migrate.rewrite import migrate_with_notes

# The modules users import Accelerate's names from.
ACCELERATE_MODULES = (
    "accelerate",
    "accelerate.accelerator",
    "accelerate.big_modeling",
    "accelerate.checkpointing",
    "accelerate.data_loader",
    "accelerate.hooks",
    "accelerate.inference",
    "accelerate.launchers",
    "accelerate.local_sgd",
    "accelerate.logging",
    "accelerate.optimizer",
    "accelerate.scheduler",
    "accelerate.state",
    "accelerate.tracking",
    "accelerate.utils",
    "accelerate.utils.dataclasses",
    "accelerate.utils.imports",
    "accelerate.utils.memory",
    "accelerate.utils.modeling",
    "accelerate.utils.offload",
    "accelerate.utils.operations",
    "accelerate.utils.other",
    "accelerate.utils.random",
)


def _public_names(module_name: str) -> list[str]:
    """Names ``module_name`` offers that Accelerate defines (not the modules and libraries it imports)."""
    module = importlib.import_module(module_name)
    names = []
    for name in sorted(set(dir(module))):
        value = getattr(module, name)
        if name.startswith("_") or inspect.ismodule(value):
            continue
        if str(getattr(value, "__module__", "") or "").startswith("accelerate"):
            names.append(name)
    return names


PAIRS = [(module, name) for module in ACCELERATE_MODULES for name in _public_names(module)]
MIGRATION_PAGE = Path(__file__).resolve().parents[1] / "docs" / "compatibility.md"
TABLE = re.compile(r"<!-- names-left-on-accelerate -->\n(.*?)<!-- /names-left-on-accelerate -->", re.DOTALL)


def _left_on_accelerate() -> list[str]:
    """The docs table's rows: each name migrate leaves on Accelerate, with the modules offering it."""
    left: dict[str, list[str]] = {}
    for module, name in PAIRS:
        if migrate_with_notes(f"from {module} import {name}\n")[1]:
            left.setdefault(name, []).append(module)
    rows = ["| name | offered by |", "|---|---|"]
    for name in sorted(left, key=str.lower):
        rows.append(f"| `{name}` | " + ", ".join(f"`{module}`" for module in left[name]) + " |")
    return rows


@pytest.mark.parametrize(("table", "package"), [("RUNTIME", x_runtime), ("BIGMODEL", x_bigmodel), ("LAUNCH", x_launch)])
def test_the_lists_migrate_carries_are_the_packages_own_exports(table: str, package) -> None:
    exported = set(package.__all__) - {"__version__"}
    carried = getattr(x_names, table)
    assert carried == exported, (
        f"x_launch.migrate.x_names.{table} and {package.__name__}.__all__ differ: "
        f"add {sorted(exported - carried)}, remove {sorted(carried - exported)}"
    )


def test_every_public_accelerate_name_migrates_to_an_import_that_works() -> None:
    assert len(PAIRS) > 300  # the scan found Accelerate's names (a vacuous list would pass)
    to_x, stayed, failed = 0, 0, []
    for module, name in PAIRS:
        text, kept = migrate_with_notes(f"from {module} import {name}\n")
        namespace: dict[str, object] = {}
        try:
            exec(compile(text, f"<{module}.{name}>", "exec"), namespace)
        except Exception as exc:
            failed.append(f"{module}.{name}: {text.strip()!r} raised {type(exc).__name__}: {exc}")
            continue
        if kept:
            assert text.startswith(f"from {module} import"), text
            assert name not in x_names.RUNTIME | x_names.BIGMODEL, f"{name} is in x but was not migrated"
            stayed += 1
        else:
            assert text.startswith("from x_"), text
            to_x += 1
    assert not failed, "migrated imports that fail:\n" + "\n".join(failed)
    print(f"{to_x} of {len(PAIRS)} Accelerate names migrate to x; {stayed} stay on Accelerate")


def test_the_migration_page_lists_every_name_migrate_leaves_on_accelerate() -> None:
    found = TABLE.search(MIGRATION_PAGE.read_text())
    assert found, f"{MIGRATION_PAGE.name} has no <!-- names-left-on-accelerate --> table"
    written = found.group(1).strip().splitlines()
    expected = _left_on_accelerate()
    if importlib.util.find_spec("deepspeed") is None:
        # Accelerate defines its DeepSpeed helpers only where DeepSpeed is installed (the table is written
        # with it): without it, their rows are not there to compare.
        written = [row for row in written if row in expected or "deepspeed" not in row.split("|")[1].lower()]
    assert len(expected) > 100  # the scan found what stays (Megatron-LM, pippy, ...): a vacuous table would pass
    assert written == expected, (
        f"{MIGRATION_PAGE.name}'s table of names left on Accelerate is out of date: "
        f"gone {sorted(set(written) - set(expected))}, new {sorted(set(expected) - set(written))}; its rows now:\n"
        + "\n".join(expected)
    )
