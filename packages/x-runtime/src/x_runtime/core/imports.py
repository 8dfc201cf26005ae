"""``is_*_available``: what this machine has, with Accelerate's names and meanings.

Device checks never initialise a device (CUDA is asked through NVML, as Accelerate asks it, so
a later fork stays clean); package checks look for the installed distribution, not merely an
importable folder of that name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from functools import lru_cache

import torch

from x_common import env
from x_runtime.core.environment import patch_environment
from x_runtime.core.settings import current_settings

__all__ = [
    "is_aim_available",
    "is_bf16_available",
    "is_bnb_available",
    "is_boto3_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp8_available",
    "is_fp16_available",
    "is_hpu_available",
    "is_ipex_available",
    "is_matplotlib_available",
    "is_mlflow_available",
    "is_mlu_available",
    "is_mps_available",
    "is_msamp_available",
    "is_musa_available",
    "is_npu_available",
    "is_pandas_available",
    "is_peft_available",
    "is_pytest_available",
    "is_rich_available",
    "is_rocm_available",
    "is_sdaa_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_timm_available",
    "is_torch_xla_available",
    "is_torchao_available",
    "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available",
    "is_tqdm_available",
    "is_trackio_available",
    "is_transformer_engine_available",
    "is_transformers_available",
    "is_wandb_available",
    "is_xpu_available",
]


def _installed(module: str, distribution: str | None = None) -> bool:
    """``module`` is importable and its distribution is installed (not a stray folder)."""
    if importlib.util.find_spec(module) is None:
        return False
    try:
        importlib.metadata.metadata(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _vendor_device(module: str, attribute: str, check_device: bool) -> bool:
    """A device that a vendor's torch extension (``torch_npu``, ``torch_musa``...) adds to torch."""
    if importlib.util.find_spec(module) is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # a broken extension (e.g. in a CPU-only container) means no device
        return False
    device = getattr(torch, attribute, None)
    if device is None:
        return False
    try:
        if check_device:
            device.device_count()
        return bool(device.is_available())
    except RuntimeError:
        return False


def is_cuda_available() -> bool:
    """Whether a CUDA (or ROCm) device is usable, asked without initialising CUDA."""
    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return torch.cuda.is_available()


def is_rocm_available() -> bool:
    return torch.version.hip is not None and torch.cuda.is_available()


@lru_cache
def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla imports; with ``check_is_tpu``/``check_is_gpu``, on that device type."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("check_is_tpu and check_is_gpu cannot both be true")
    if importlib.util.find_spec("torch_xla") is None:
        return False
    try:
        importlib.import_module("torch_xla.core.xla_model")
        runtime = importlib.import_module("torch_xla.runtime")
    except ImportError:
        return False
    if check_is_gpu:
        return runtime.device_type() in ("GPU", "CUDA")
    if check_is_tpu:
        return runtime.device_type() == "TPU"
    return True


@lru_cache
def is_mps_available(min_version: str = "1.12") -> bool:
    return torch.backends.mps.is_available() and torch.backends.mps.is_built()


@lru_cache
def is_xpu_available(check_device: bool = False) -> bool:
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return False
    try:
        if check_device:
            xpu.device_count()
        return bool(xpu.is_available())
    except RuntimeError:
        return False


@lru_cache
def is_hpu_available(init_hccl: bool = False) -> bool:
    """Whether Habana's ``habana_frameworks.torch`` is installed and an HPU is present."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    if importlib.util.find_spec("habana_frameworks.torch") is None:
        return False
    importlib.import_module("habana_frameworks.torch")
    if init_hccl:
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
    hpu = getattr(torch, "hpu", None)
    return hpu is not None and bool(hpu.is_available())


@lru_cache
def is_npu_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_npu", "npu", check_device)


@lru_cache
def is_mlu_available(check_device: bool = False) -> bool:
    if importlib.util.find_spec("torch_mlu") is None:
        return False
    importlib.import_module("torch_mlu")
    with patch_environment(PYTORCH_CNDEV_BASED_MLU_CHECK="1"):
        return bool(torch.mlu.is_available())  # type: ignore[attr-defined]


@lru_cache
def is_sdaa_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_sdaa", "sdaa", check_device)


@lru_cache
def is_musa_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_musa", "musa", check_device)


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bf16 compute is supported here (always on CPU; by the device elsewhere)."""
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    if is_mlu_available():
        return bool(torch.mlu.is_bf16_supported())  # type: ignore[attr-defined]
    if is_xpu_available():
        return bool(torch.xpu.is_bf16_supported())
    if is_mps_available():
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return True


def is_fp16_available() -> bool:
    """Whether fp16 is supported: everywhere but on a first-generation Gaudi."""
    if is_hpu_available():
        experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
        if experimental._get_device_type() == experimental.synDeviceType.synDeviceGaudi:
            return False
    return True


def is_ipex_available() -> bool:
    return _installed("intel_extension_for_pytorch")


def is_bnb_available(min_version: str | None = None) -> bool:
    if not _installed("bitsandbytes"):
        return False
    if min_version is None:
        return True
    from torch.torch_version import TorchVersion  # a version string that compares as versions do

    return TorchVersion(importlib.metadata.version("bitsandbytes")) >= min_version


def is_datasets_available() -> bool:
    return _installed("datasets")


def is_pytest_available() -> bool:
    return _installed("pytest")


def is_deepspeed_available() -> bool:
    return _installed("deepspeed")


def is_transformers_available() -> bool:
    return _installed("transformers")


def is_tensorboard_available() -> bool:
    return _installed("tensorboard") or _installed("tensorboardX")


def is_wandb_available() -> bool:
    return _installed("wandb")


def is_mlflow_available() -> bool:
    if _installed("mlflow"):
        return True
    return importlib.util.find_spec("mlflow") is not None and _installed("mlflow", "mlflow-skinny")


def is_comet_ml_available() -> bool:
    return _installed("comet_ml")


def is_dvclive_available() -> bool:
    return _installed("dvclive")


def is_aim_available() -> bool:
    """Aim 3 (the tracker's API; Aim 4 changed it), as Accelerate checks."""
    from x_runtime.core.versions import compare_versions

    return _installed("aim") and compare_versions("aim", "<", "4.0.0")


def is_clearml_available() -> bool:
    return _installed("clearml")


def is_swanlab_available() -> bool:
    return _installed("swanlab")


def is_trackio_available() -> bool:
    return _installed("trackio")


def is_torchdata_available() -> bool:
    return _installed("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """torchdata 0.8 or newer, which has ``StatefulDataLoader``."""
    from x_runtime.core.versions import compare_versions

    return is_torchdata_available() and compare_versions("torchdata", ">=", "0.8.0")


def is_peft_available() -> bool:
    return _installed("peft")


def is_timm_available() -> bool:
    return _installed("timm")


def is_torchvision_available() -> bool:
    return _installed("torchvision")


def is_pandas_available() -> bool:
    return _installed("pandas")


def is_matplotlib_available() -> bool:
    return _installed("matplotlib")


def is_boto3_available() -> bool:
    return _installed("boto3")


def is_rich_available() -> bool:
    """rich installed and asked for (``ACCELERATE_ENABLE_RICH``), as Accelerate checks."""
    return _installed("rich") and bool(current_settings().get(env.ACCELERATE_ENABLE_RICH))


def is_tqdm_available() -> bool:
    return _installed("tqdm")


def is_torchao_available() -> bool:
    """torchao 0.6.1 or newer (its float8 training API), as Accelerate checks."""
    from x_runtime.core.versions import compare_versions

    return _installed("torchao") and compare_versions("torchao", ">=", "0.6.1")


def is_transformer_engine_available() -> bool:
    return _installed("transformer_engine", "transformer-engine")


def is_msamp_available() -> bool:
    return _installed("msamp", "ms-amp")


def is_fp8_available() -> bool:
    """Whether an fp8 backend Accelerate knows is installed (MS-AMP, Transformer Engine, torchao).

    x trains in fp8 through torchao only (``mixed_precision="fp8"``); the answer is Accelerate's,
    which libraries read before they offer fp8 at all.
    """
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()
