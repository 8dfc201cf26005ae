"""What a launcher writes with ``x_common.env`` is what a process it starts reads back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from x_common import env

READER = """
import json, sys
from x_common import env, process_env
values = env.read_contract()
values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
print(json.dumps({"contract": values, "rank": process_env().rank, "world": process_env().world_size}))
"""


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX) and k not in ("RANK", "WORLD_SIZE")}
    return {**base, **extra}


def test_values_survive_the_process_boundary() -> None:
    written = env.to_environ(
        {
            env.MIXED_PRECISION: "bf16",
            env.USE_CPU: True,
            env.GRADIENT_ACCUMULATION_STEPS: 8,
            env.FSDP_TRANSFORMER_CLS_TO_WRAP: ("LlamaDecoderLayer", "LlamaMLP"),
            env.DEEPSPEED_GRADIENT_CLIPPING: 1.0,
            env.RANK: 1,
            env.WORLD_SIZE: 2,
        }
    )
    out = subprocess.run(
        [sys.executable, "-c", READER], env=_child_env(written), capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["rank"] == 1 and seen["world"] == 2
    contract = seen["contract"]
    assert contract["X_MIXED_PRECISION"] == "bf16"
    assert contract["X_USE_CPU"] is True
    assert contract["X_GRADIENT_ACCUMULATION_STEPS"] == 8
    assert contract["X_FSDP_TRANSFORMER_CLS_TO_WRAP"] == ["LlamaDecoderLayer", "LlamaMLP"]
    assert contract["X_DEEPSPEED_GRADIENT_CLIPPING"] == 1.0
    assert contract["X_DYNAMO_BACKEND"] == "no"  # unset: the default


def test_a_malformed_value_is_named_in_the_child_error() -> None:
    out = subprocess.run(
        [sys.executable, "-c", READER], env=_child_env({"X_MIXED_PRECISION": "fp32"}), capture_output=True, text=True
    )
    assert out.returncode == 1
    assert "X_MIXED_PRECISION='fp32' is not valid: expected one of no, fp16, bf16, fp8" in out.stderr
