"""Precision: mixed-precision autocast and the fp16 scaler, fp8 through torchao, ``torch.compile``.

``policy`` (``Precision``: autocast dtype, grad scaler, the autocasting forward), ``fp8``
(recipes, the hardware check, the conversion) and ``dynamo`` (``TorchDynamoPlugin``, whole or
regional compilation of the prepared model).
"""

from x_runtime.precision.dynamo import TorchDynamoPlugin, compile_model, repeated_blocks
from x_runtime.precision.fp8 import apply_fp8, check_fp8, fp8_recipe, fp8_recipe_for
from x_runtime.precision.policy import Precision, convert_to_fp32, unwrap_forward

__all__ = [
    "Precision",
    "TorchDynamoPlugin",
    "apply_fp8",
    "check_fp8",
    "compile_model",
    "convert_to_fp32",
    "fp8_recipe",
    "fp8_recipe_for",
    "repeated_blocks",
    "unwrap_forward",
]
