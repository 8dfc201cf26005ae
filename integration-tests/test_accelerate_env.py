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


DEEPSPEED_FILE = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
num_machines: 1
machine_rank: 0
num_processes: 2
use_cpu: false
mixed_precision: bf16
deepspeed_config:
  zero_stage: 2
  offload_optimizer_device: none
  offload_param_device: none
  gradient_accumulation_steps: 4
  zero3_init_flag: false
"""

# Accelerate's own path from a config file to its ranks' variables, as `accelerate launch` takes it
# (DeepSpeed itself is not needed for it).
ACCELERATE_ENV = """
import sys
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_deepspeed_cmd_env
args = launch_command_parser().parse_args(["--config_file", sys.argv[1], "train.py"])
args, defaults, _ = _validate_launch_command(args)
args.deepspeed_fields_from_accelerate_config = list(defaults.deepspeed_config)
print(prepare_deepspeed_cmd_env(args)[1]["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"])
"""


def test_a_deepspeed_files_accumulation_reaches_the_ranks_as_under_accelerate(tmp_path: Path, launch_env) -> None:
    pytest.importorskip("accelerate")
    config = tmp_path / "ds.yaml"
    config.write_text(DEEPSPEED_FILE)
    environ = launch_env(tmp_path)
    theirs = subprocess.run(
        [sys.executable, "-c", ACCELERATE_ENV, str(config)], capture_output=True, text=True, env=environ, timeout=120
    )
    assert theirs.returncode == 0, theirs.stderr
    (tmp_path / "train.py").write_text("")
    x_launch = str(Path(sys.executable).with_name("x-launch"))
    ours = subprocess.run(
        [x_launch, "--config_file", str(config), "--dry-run", str(tmp_path / "train.py")],
        capture_output=True, text=True, env=environ, timeout=120,
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    assert theirs.stdout.strip() == "4"
    assert "  X_GRADIENT_ACCUMULATION_STEPS=4" in ours.stdout.splitlines()
