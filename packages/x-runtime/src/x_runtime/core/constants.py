"""Accelerate's named constants (``accelerate.utils.constants``) that libraries read, with its values.

transformers validates ``TrainingArguments.fsdp`` options against the FSDP lists and names
checkpoint files with the file names; the values are Accelerate's (a test compares them with the
real package), the FSDP choices built from the contract's own lists in Accelerate's order.
"""

from __future__ import annotations

import operator

from x_common import env

__all__ = [
    "FSDP2_STATE_DICT_TYPE",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_MODEL_NAME",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_STATE_DICT_TYPE",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "STR_OPERATION_TO_FUNC",
    "TORCH_DYNAMO_MODES",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
]

FSDP_SHARDING_STRATEGY = list(env.FSDP_SHARDING_STRATEGIES)
FSDP_AUTO_WRAP_POLICY = list(env.FSDP_AUTO_WRAP_POLICIES)
FSDP_BACKWARD_PREFETCH = list(env.FSDP_BACKWARD_PREFETCHES)
# Accelerate numbers FSDP1's state dict types in torch's enum order.
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
FSDP_MODEL_NAME = "pytorch_model_fsdp"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = f"{MODEL_NAME}{{suffix}}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = f"{SAFE_MODEL_NAME}{{suffix}}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"

STR_OPERATION_TO_FUNC = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}
