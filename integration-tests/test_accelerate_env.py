"""A script started by ``accelerate launch`` trains under x as Accelerate's flags say.

``accelerate launch`` writes Accelerate's variables (``ACCELERATE_MIXED_PRECISION``, ...), not
x's; ``x_common.env`` reads them as fallbacks, so ``x_runtime`` honours them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
from x_runtime import Accelerator
accelerator = Accelerator()
print(f"mixed_precision={accelerator.mixed_precision} device={accelerator.device.type}", flush=True)
"""


def test_accelerate_launch_mixed_precision_reaches_x_runtime(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("x_runtime")
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    if accelerate is None:
        pytest.skip("the accelerate console script is not installed")
    (tmp_path / "train.py").write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "ACCELERATE_", "RANK", "WORLD_SIZE"))}
    environ["HF_HOME"] = str(tmp_path / "hf")  # no Accelerate config file from this machine
    out = subprocess.run(
        [accelerate, "launch", "--cpu", "--mixed_precision", "bf16", "--num_processes", "1", "--num_machines", "1",
         "--dynamo_backend", "no", "train.py"],
        capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "mixed_precision=bf16 device=cpu" in out.stdout
