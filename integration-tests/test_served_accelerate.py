"""x's tables of the served ``accelerate`` modules, name by name against the real Accelerate's modules.

Every package is installed here beside the real Accelerate (imported as itself: this process does
not serve it), so each served name is checked where it is looked up: it exists in Accelerate's module
of the same name, is the same kind of thing (class, function, constant of equal value), and no name
that module has and x exports under the same name is left out of the table.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import types
from typing import Any

import pytest

pytest.importorskip("accelerate")

from x_runtime.provide import SERVED

X_PACKAGES = ("x_runtime", "x_bigmodel", "x_launch")
# Names Accelerate's module holds only beside DeepSpeed (accelerate/utils/__init__.py imports them under
# is_deepspeed_available()); x serves them whatever is installed: without DeepSpeed they are read from
# accelerate.utils.deepspeed, which always holds them.
BESIDE_DEEPSPEED = {"accelerate.utils", "accelerate.accelerator"}


def _kind(value: Any) -> str:
    if isinstance(value, type):
        return "enum" if issubclass(value, enum.Enum) else "class"
    if callable(value):
        return "function"
    return "constant"


def _defines(module: types.ModuleType) -> dict[str, Any]:
    """The names Accelerate's module holds as its API: its own objects and constants (not other packages')."""
    found = {}
    for name, value in vars(module).items():
        if name.startswith("__") or isinstance(value, types.ModuleType):
            continue
        constant = isinstance(value, (str, int, float, bool, list, dict, tuple, set, frozenset)) or value is None
        if constant or str(getattr(value, "__module__", "")).startswith("accelerate"):
            found[name] = value
    return found


@pytest.mark.parametrize("module", sorted(SERVED))
def test_every_served_name_is_accelerates(module: str) -> None:
    real = importlib.import_module(module)
    table = SERVED[module]
    assert table.package == hasattr(real, "__path__"), f"{module}: package={table.package} in the table"
    problems = []
    deepspeed = importlib.import_module("accelerate.utils.deepspeed")
    for name, home in table.homes.items():
        holder = deepspeed if module in BESIDE_DEEPSPEED and not hasattr(real, name) else real
        if not hasattr(holder, name):
            problems.append(f"{name}: Accelerate's {module} has no such name")
            continue
        ours = getattr(importlib.import_module(home.module), home.attr)
        theirs = getattr(holder, name)
        # DistributedType, LoggerType...: Accelerate's enums are plain classes of string constants in x.
        kinds = {_kind(ours), _kind(theirs)}
        if len(kinds) > 1 and kinds != {"enum", "class"}:
            problems.append(f"{name}: x's is a {_kind(ours)}, Accelerate's a {_kind(theirs)}")
        elif isinstance(theirs, dict) and any(isinstance(v, type) for v in theirs.values()):
            if set(ours) != set(theirs):  # a registry of classes (LOGGER_TYPE_TO_CLASS): the same keys, x's classes
                problems.append(f"{name}: x's keys {sorted(ours)} are not Accelerate's {sorted(theirs)}")
        elif _kind(theirs) == "constant" and ours != theirs:
            problems.append(f"{name}: x's value {ours!r} is not Accelerate's {theirs!r}")
    assert not problems, f"{module}:\n" + "\n".join(problems)


@pytest.mark.parametrize("module", sorted(SERVED))
def test_no_name_x_has_is_left_unserved(module: str) -> None:
    real = importlib.import_module(module)
    served = SERVED[module].homes
    exported = {name for package in X_PACKAGES for name in importlib.import_module(package).__all__}
    left = sorted(name for name in _defines(real) if name in exported and name not in served)
    assert not left, f"{module} serves none of these, which x exports under Accelerate's names: {left}"


# The keywords the libraries pass by name, or probe with inspect.signature (transformers' dispatch).
PASSED_BY_NAME = {
    "dispatch_model": ("device_map", "offload_dir", "offload_index", "offload_buffers", "skip_keys", "force_hooks"),
    "infer_auto_device_map": ("max_memory", "no_split_module_classes", "dtype", "special_dtypes", "verbose"),
    "get_balanced_memory": ("max_memory", "no_split_module_classes", "dtype", "special_dtypes", "low_zero"),
    "set_module_tensor_to_device": ("value", "dtype", "non_blocking", "clear_cache"),
}


@pytest.mark.parametrize("name", sorted(PASSED_BY_NAME))
def test_the_libraries_keywords_are_taken(name: str) -> None:
    import accelerate.utils.modeling

    import x_bigmodel

    real = getattr(accelerate, name, None) or getattr(accelerate.utils.modeling, name)
    theirs = set(inspect.signature(real).parameters)
    ours = set(inspect.signature(getattr(x_bigmodel, name)).parameters)
    assert set(PASSED_BY_NAME[name]) <= theirs, "the list names a keyword Accelerate does not take"
    assert set(PASSED_BY_NAME[name]) <= ours, f"{name}: x lacks {sorted(set(PASSED_BY_NAME[name]) - ours)}"
