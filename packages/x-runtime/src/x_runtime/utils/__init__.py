"""Accelerate's small utilities: the ``is_*_available`` checks and ``patch_environment``.

``imports`` says what this machine has (devices asked without initialising them, packages by
their installed distribution); ``environment`` sets variables for the length of a block.
"""

from x_runtime.utils.environment import patch_environment
from x_runtime.utils.imports import (
    is_bf16_available,
    is_bnb_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_fp16_available,
    is_hpu_available,
    is_ipex_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_npu_available,
    is_pytest_available,
    is_rocm_available,
    is_sdaa_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_transformers_available,
    is_wandb_available,
    is_xpu_available,
)

__all__ = [
    "is_bf16_available",
    "is_bnb_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_fp16_available",
    "is_hpu_available",
    "is_ipex_available",
    "is_mlflow_available",
    "is_mlu_available",
    "is_mps_available",
    "is_musa_available",
    "is_npu_available",
    "is_pytest_available",
    "is_rocm_available",
    "is_sdaa_available",
    "is_tensorboard_available",
    "is_torch_xla_available",
    "is_transformers_available",
    "is_wandb_available",
    "is_xpu_available",
    "patch_environment",
]
