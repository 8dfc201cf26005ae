"""``DeepSpeedPlugin``: a DeepSpeed JSON config (file, dict or ``HfDeepSpeedConfig``) or Accelerate's plugin fields.

Fields left as ``None`` take the launcher's ``deepspeed_config`` section (``x_common.env``).
Without a config file, one is built from the fields. Values written "auto" are filled in
``prepare`` from what was prepared (see ``strategies.deepspeed``).

The config is one dict, held by ``hf_ds_config`` (an ``HfDeepSpeedConfig``) and read through
``config`` / ``deepspeed_config`` when ``prepare`` builds the engine: transformers' ``Trainer``
hands its own ``HfDeepSpeedConfig`` subclass and fills its "auto" values in place after the
Accelerator exists, and those fills must reach the engine (a copy would lose them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from x_common import env
from x_runtime.core.settings import current_settings
from x_runtime.strategies.deepspeed_standins import HfDeepSpeedConfig, is_file, read_deepspeed_config

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
        settings = current_settings()  # one snapshot for every field read here
        if self.hf_ds_config is None and settings.is_set(env.DEEPSPEED_CONFIG_FILE):
            self.hf_ds_config = settings.get(env.DEEPSPEED_CONFIG_FILE)
        for name, var in (
            ("zero_stage", env.DEEPSPEED_ZERO_STAGE),
            ("gradient_clipping", env.DEEPSPEED_GRADIENT_CLIPPING),
            ("offload_optimizer_device", env.DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE),
            ("offload_param_device", env.DEEPSPEED_OFFLOAD_PARAM_DEVICE),
            ("zero3_save_16bit_model", env.DEEPSPEED_ZERO3_SAVE_16BIT_MODEL),
        ):
            if getattr(self, name) is None:
                setattr(self, name, settings.get(var))
        if self.zero3_init_flag is None and settings.is_set(env.DEEPSPEED_ZERO3_INIT):
            self.zero3_init_flag = settings.get(env.DEEPSPEED_ZERO3_INIT)  # unset: on under ZeRO-3 (below)
        source = self.hf_ds_config
        self.hf_ds_config = source if isinstance(source, HfDeepSpeedConfig) else HfDeepSpeedConfig(self._load(source))
        config = self.config
        zero = config.setdefault("zero_optimization", {})
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
        gather = "stage3_gather_16bit_weights_on_model_save"
        if zero.get(gather) == "auto" or (self.zero3_save_16bit_model and gather not in zero):
            zero[gather] = bool(self.zero3_save_16bit_model)
        config.setdefault("train_micro_batch_size_per_gpu", "auto")
        config.setdefault("gradient_accumulation_steps", "auto")
        if self.gradient_clipping is not None:
            config.setdefault("gradient_clipping", "auto")
        config.setdefault("steps_per_print", 2**31 - 1)  # DeepSpeed's own progress lines off
        self.hf_ds_config.set_stage_and_offload()
        # ZeRO-3 builds the model partitioned unless told not to (Accelerate's default), elsewhere never.
        self.zero3_init_flag = self.zero_stage == 3 and self.zero3_init_flag is not False
        self._weakref: Any = None

    @property
    def config(self) -> dict[str, Any]:
        """The DeepSpeed config the engine is built from (``hf_ds_config.config``, the same dict)."""
        held: dict[str, Any] = self.hf_ds_config.config
        return held

    @config.setter
    def config(self, value: dict[str, Any]) -> None:
        self.hf_ds_config.config = value

    # Accelerate's name for the same dict (transformers reassigns it after building its own HfDeepSpeedConfig).
    deepspeed_config = config

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The config's value at a dotted key (``"zero_optimization.stage"``)."""
        return self.hf_ds_config.get_value(ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config says "auto" at ``ds_key_long``."""
        return bool(self.get_value(ds_key_long) == "auto")

    def fill_match(
        self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: Any
    ) -> None:
        """Fill an "auto" value from ``kwargs``; with ``must_match``, note a set value that differs from it.

        Raises:
            ValueError: the value is "auto" and ``kwargs`` does not give it.
        """
        node, key = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None:
            return
        if node.get(key) == "auto":
            if ds_key_long not in kwargs:
                raise ValueError(f'{ds_key_long} is "auto" in the DeepSpeed config and nothing gives its value; set it')
            node[key] = kwargs[ds_key_long]
        elif (
            must_match
            and mismatches is not None
            and ds_key_long in kwargs
            and node.get(key) not in (None, kwargs[ds_key_long])
        ):
            mismatches.append(f"- ds {ds_key_long}={node[key]} vs arg {ds_key_long}={kwargs[ds_key_long]}")

    def deepspeed_config_process(self, must_match: bool = True, **kwargs: Any) -> None:
        """``fill_match`` every key ``kwargs`` names (dotted keys, as Accelerate writes them).

        Raises:
            ValueError: with ``must_match``, set values that differ from ``kwargs``, listed.
        """
        mismatches: list[str] = []
        for key in kwargs:
            self.fill_match(key, mismatches, must_match=must_match, **kwargs)
        if mismatches:
            raise ValueError(
                'these DeepSpeed config values differ from the run\'s; write them as "auto":\n' + "\n".join(mismatches)
            )

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Turn on the config's fp16 or bf16 section for ``mixed_precision``, the other off, as Accelerate does."""
        config = self.config
        if mixed_precision == "fp16":
            config.setdefault("fp16", {"enabled": True, "auto_cast": True})
        elif mixed_precision in ("bf16", "fp8"):
            config.setdefault("bf16", {"enabled": True})
        if mixed_precision != "no":
            other = "bf16" if mixed_precision == "fp16" else "fp16"
            if str(config.get(other, {}).get("enabled", False)).lower() == "true":
                raise ValueError(
                    f"the DeepSpeed config enables {other}, but the run's mixed precision is {mixed_precision}"
                )
        for key, wanted in (("fp16", mixed_precision == "fp16"), ("bf16", mixed_precision in ("bf16", "fp8"))):
            section = config.get(key)
            if isinstance(section, dict) and section.get("enabled") == "auto":
                section["enabled"] = wanted

    def set_deepspeed_weakref(self) -> None:
        """Under ZeRO-3 init, give transformers the config it builds models partitioned from (kept alive here)."""
        if not self.zero3_init_flag:
            return
        from transformers.integrations import HfDeepSpeedConfig as TransformersConfig

        resolved = copy.deepcopy(self.config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if resolved.get(key, "auto") == "auto":
                resolved[key] = 1
        if resolved.get("train_batch_size") == "auto":
            del resolved["train_batch_size"]
        self._weakref = TransformersConfig(resolved)  # type: ignore[no-untyped-call]  # transformers' __init__ is untyped

    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag)

    @staticmethod
    def _load(source: Any) -> dict[str, Any]:
        """A copy of the config (``"auto"`` values are filled in place), from a file, dict, JSON text or
        an ``HfDeepSpeedConfig``."""
        if source is None:
            return {}
        if isinstance(source, HfDeepSpeedConfig):
            source = source.config
        if not isinstance(source, dict) and not is_file(str(source)):
            try:
                return read_deepspeed_config(source)
            except ValueError:
                raise ValueError(f"DeepSpeed config {source} does not exist; give a JSON file or a dict") from None
        return read_deepspeed_config(source)
