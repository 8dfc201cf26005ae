"""``DeepSpeedPlugin``: a DeepSpeed JSON config (file or dict) or Accelerate's plugin fields.

Fields left as ``None`` take the launcher's ``deepspeed_config`` section (``x_common.env``).
Without a config file, one is built from the fields. Values written "auto" are filled in
``prepare`` from what was prepared (see ``strategies.deepspeed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from x_common import env
from x_runtime.strategies.deepspeed_standins import HfDeepSpeedConfig, read_deepspeed_config

__all__ = ["DeepSpeedPlugin"]


@dataclass
class DeepSpeedPlugin:
    """How ``prepare`` builds the DeepSpeed engine.

    Args:
        hf_ds_config: a DeepSpeed config: path to its JSON file, or the dict.
        zero_stage: 0-3 (used when no config is given, or filled into its "auto").
        gradient_accumulation_steps: defaults to the accelerator's.
        gradient_clipping: max gradient norm DeepSpeed clips to (None: no clipping).
        offload_optimizer_device: where optimizer state lives: "none", "cpu" or "nvme".
        offload_param_device: where ZeRO-3 parameters live: "none", "cpu" or "nvme".
        zero3_init_flag: build the model partitioned (``deepspeed.zero.Init``) under ZeRO-3.
        zero3_save_16bit_model: gather 16-bit weights when saving a ZeRO-3 model.
    """

    hf_ds_config: Any = None
    zero_stage: int | None = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None

    def __post_init__(self) -> None:
        if self.hf_ds_config is None and env.DEEPSPEED_CONFIG_FILE.is_set():
            self.hf_ds_config = env.DEEPSPEED_CONFIG_FILE.read()
        for name, var in (
            ("zero_stage", env.DEEPSPEED_ZERO_STAGE),
            ("gradient_clipping", env.DEEPSPEED_GRADIENT_CLIPPING),
            ("offload_optimizer_device", env.DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE),
            ("offload_param_device", env.DEEPSPEED_OFFLOAD_PARAM_DEVICE),
            ("zero3_init_flag", env.DEEPSPEED_ZERO3_INIT),
            ("zero3_save_16bit_model", env.DEEPSPEED_ZERO3_SAVE_16BIT_MODEL),
        ):
            if getattr(self, name) is None:
                setattr(self, name, var.read())
        self.config = self._load(self.hf_ds_config)
        zero = self.config.setdefault("zero_optimization", {})
        if "stage" not in zero or zero["stage"] == "auto":
            zero["stage"] = 2 if self.zero_stage is None else int(self.zero_stage)
        elif self.zero_stage is not None and int(zero["stage"]) != int(self.zero_stage):
            raise ValueError(
                f"the DeepSpeed config says zero_optimization.stage={zero['stage']} but zero_stage={self.zero_stage}; "
                "make them agree"
            )
        if int(zero["stage"]) not in (0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage={zero['stage']!r}: expected 0, 1, 2 or 3")
        self.zero_stage = int(zero["stage"])
        for key, device in (
            ("offload_optimizer", self.offload_optimizer_device),
            ("offload_param", self.offload_param_device),
        ):
            if device not in (None, "none") and key not in zero:
                zero[key] = {"device": device}
        self.config.setdefault("train_micro_batch_size_per_gpu", "auto")
        self.config.setdefault("gradient_accumulation_steps", "auto")
        if self.gradient_clipping is not None:
            self.config.setdefault("gradient_clipping", "auto")
        self.config.setdefault("steps_per_print", 2**31 - 1)  # DeepSpeed's own progress lines off

    @staticmethod
    def _load(source: Any) -> dict[str, Any]:
        """A copy of the config (``"auto"`` values are filled in place), from a file, dict, JSON text or
        an ``HfDeepSpeedConfig``."""
        if source is None:
            return {}
        if isinstance(source, HfDeepSpeedConfig):
            source = source.config
        if not isinstance(source, dict) and not Path(source).is_file():
            try:
                return read_deepspeed_config(source)
            except ValueError:
                raise ValueError(f"DeepSpeed config {source} does not exist; give a JSON file or a dict") from None
        return read_deepspeed_config(source)
