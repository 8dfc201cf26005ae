"""Accelerate's ``accelerate.utils`` names: the ``is_*_available`` checks, version and environment helpers.

The top layer of x_runtime, beside the facade: it holds no code of its own and re-exports names
from the layers that keep them (``core.imports`` says what this machine has, devices asked
without initialising them and packages by their installed distribution; ``core.environment``
sets variables for the length of a block).
"""

from x_runtime.accelerator.extract import extract_model_from_parallel
from x_runtime.core import constants, imports
from x_runtime.core.configs import DataLoaderConfiguration, ProjectConfiguration
from x_runtime.core.constants import *  # noqa: F403 - Accelerate's constants, named once in constants.__all__
from x_runtime.core.environment import (
    clear_environment,
    convert_dict_to_env_variables,
    patch_environment,
    purge_accelerate_environment,
)
from x_runtime.core.imports import *  # noqa: F403 - every check, named once in imports.__all__
from x_runtime.core.model_parallel import get_model_tp_size
from x_runtime.core.module_lookup import get_module_class_from_name, get_parameters_from_modules
from x_runtime.core.nested import concatenate, listify, pad_input_tensors, recursively_apply
from x_runtime.core.parallel_handlers import (
    BETA_CP_AVAILABLE_PYTORCH_VERSION,
    BETA_SP_AVAILABLE_DEEPSPEED_VERSION,
    BETA_TP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
)
from x_runtime.core.system import check_os_kernel
from x_runtime.core.unwrap import is_peft_model
from x_runtime.core.versions import compare_versions, is_torch_version
from x_runtime.precision.policy import convert_outputs_to_fp32
from x_runtime.process.collectives.errors import CannotPadNestedTensorWarning
from x_runtime.process.operations.progress_bar import tqdm
from x_runtime.process.operations.saving import save

__all__ = [
    *imports.__all__,
    *constants.__all__,
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "CannotPadNestedTensorWarning",
    "DataLoaderConfiguration",
    "ProjectConfiguration",
    "check_os_kernel",
    "concatenate",
    "convert_dict_to_env_variables",
    "convert_outputs_to_fp32",
    "listify",
    "pad_input_tensors",
    "recursively_apply",
    "save",
    "tqdm",
    "clear_environment",
    "compare_versions",
    "extract_model_from_parallel",
    "get_model_tp_size",
    "get_module_class_from_name",
    "get_parameters_from_modules",
    "is_peft_model",
    "is_torch_version",
    "patch_environment",
    "purge_accelerate_environment",
]
