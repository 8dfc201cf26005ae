"""Importing x_common, and asking it about sizes, dtypes and the environment, imports no torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import x_common

SRC = str(Path(x_common.__file__).resolve().parents[1])

EXPECTED_MODULES = {
    "x_common.kinds",
    "x_common.nvml",
    "x_common._version",
    "x_common.devices",
    "x_common.dtypes",
    "x_common.env",
    "x_common.fsdp_reshard",
    "x_common.host_memory",
    "x_common.module_sizes",
    "x_common.process_env",
    "x_common.sizes",
    "x_common.slurm",
}

SCRIPT = textwrap.dedent(
    """
    import importlib
    import pkgutil
    import sys

    import x_common

    names = sorted(m.name for m in pkgutil.iter_modules(x_common.__path__, "x_common."))
    for name in names:
        importlib.import_module(name)

    from x_common import env
    from x_common.devices import device_count, list_devices
    from x_common.dtypes import dtype_bits, dtype_name, is_floating, tensor_nbytes
    from x_common.host_memory import host_memory
    from x_common.process_env import process_env
    from x_common.sizes import format_size, parse_size
    from x_common.slurm import expand_nodelist

    assert parse_size("10GiB") == 10737418240
    assert format_size(433249280) == "413.18 MiB"
    assert dtype_bits("torch.int4") == 4 and dtype_name("bf16") == "bfloat16" and is_floating("fp8")
    assert tensor_nbytes(3, "int4") == 2
    assert env.read_contract({"X_MIXED_PRECISION": "BF16"})["X_MIXED_PRECISION"] == "bf16"
    assert env.to_environ({env.USE_CPU: True}) == {"X_USE_CPU": "1"}
    assert env.launch_flag_var("--num_processes") == "X_LAUNCH_NUM_PROCESSES"
    assert process_env({"RANK": "0", "WORLD_SIZE": "2"}).world_size == 2
    assert expand_nodelist("n[1-2]") == ["n1", "n2"]
    assert host_memory().total > 0
    assert device_count("cpu") == 1 and len(list_devices("cpu")) == 1

    heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    assert not heavy, heavy
    print("\\n".join(names))
    """
)


def test_import_and_use_without_torch() -> None:
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environ, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    imported = set(result.stdout.split())
    assert imported >= EXPECTED_MODULES
