"""DeepSpeed ZeRO stages 0-3: the engine built in ``prepare``, "auto" values filled, checkpoints
through the engine.

As in Accelerate, ``backward`` runs ``engine.backward`` then ``engine.step`` (the engine counts
micro-batches and updates on accumulation boundaries, clipping to its ``gradient_clipping``);
the prepared optimizer's ``step``/``zero_grad`` do nothing. DeepSpeed divides the loss by the
accumulation steps itself, so the accelerator does not. The model, its optimizer and its
dataloader must be prepared in one call: the engine needs all three.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from x_common import env
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.process.state import ProcessState
from x_runtime.strategies.base import Replacements
from x_runtime.strategies.deepspeed_plugin import DeepSpeedPlugin
from x_runtime.strategies.defaults import StrategyDefaults

__all__ = ["DeepSpeedStrategy", "fill_auto_values"]

_INSTALL = "pip install 'x-runtime[deepspeed]'"
_HIDDEN_AUTO: dict[str, Callable[[int], int]] = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}


class DeepSpeedStrategy(StrategyDefaults):
    distributed_type = "DEEPSPEED"
    scales_loss_for_accumulation = True

    def __init__(self, state: ProcessState, plugin: DeepSpeedPlugin | None, mixed_precision: str):
        self.state = state
        if state.device.type == "cpu" and not env.DS_ACCELERATOR.is_set():
            os.environ[env.DS_ACCELERATOR.name] = "cpu"  # read by DeepSpeed when it is imported
        try:
            import deepspeed
        except ImportError:
            raise ValueError(
                f"distributed_type DEEPSPEED needs DeepSpeed, which is not installed: {_INSTALL}"
            ) from None
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError(
                "DeepSpeed needs a process group, but this process was started alone (no RANK/WORLD_SIZE from a "
                "launcher); start it with `x-launch --num_processes N script.py` or torchrun"
            )
        if state.device.type == "cpu":
            # DeepSpeed JIT-compiles a shared-memory op (~70 s, needs a C++ compiler) at start-up;
            # only its inference all-reduce uses it, never training, so it is marked unavailable.
            compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
            if isinstance(compatible, dict):
                compatible["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=state.backend)
        self.plugin = plugin or DeepSpeedPlugin()
        self.mixed_precision = mixed_precision
        self.engines: dict[int, Any] = {}  # id(user's module) -> engine

    # --- prepare -----------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # the engine places it

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        return model  # the engine is built in finish_prepare, once the optimizer and loader are known

    def finish_prepare(self, prepared: Sequence[Any], *, accumulation_steps: int) -> Replacements:
        """Build the engine from the model, its optimizer and its loader; it replaces the model, and
        its optimizer steps inside ``backward`` for the prepared one."""
        import deepspeed

        models = [
            i for i, obj in enumerate(prepared) if isinstance(obj, torch.nn.Module) and id(obj) not in self.engines
        ]
        if not models:
            return Replacements()
        if len(models) > 1:
            raise ValueError("DeepSpeed trains one model per accelerator; prepare one model with its optimizer")
        model = prepared[models[0]]
        optimizers = [i for i, obj in enumerate(prepared) if isinstance(obj, AcceleratedOptimizer)]
        loaders = [obj for obj in prepared if isinstance(obj, torch.utils.data.DataLoader)]
        config = self.plugin.config
        if optimizers and "optimizer" in config:
            raise ValueError(
                f"the DeepSpeed config names an optimizer ({config['optimizer'].get('type')}) and a torch optimizer "
                "was prepared too; drop one of them"
            )
        steps = fill_auto_values(
            config,
            micro_batch=loaders[0].batch_size if loaders else None,
            accumulation=accumulation_steps,
            world_size=self.state.world_size,
            mixed_precision=self.mixed_precision,
            clipping=self.plugin.gradient_clipping,
            hidden_size=_hidden_size(model),
        )
        client = prepared[optimizers[0]].optimizer if optimizers else None
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=client,
            model_parameters=model.parameters() if client is None else None,
            config=config,
        )
        self.engines[id(model)] = engine
        return Replacements(
            models={models[0]: engine}, optimizers=dict.fromkeys(optimizers, ds_optimizer), num_steps=steps
        )

    # --- the step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: Any, **kwargs: Any) -> None:
        engine = self._engine()
        engine.backward(loss, **kwargs)
        engine.step()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        configured = self.plugin.config.get("gradient_clipping")
        if configured in (None, "auto") or not math.isclose(float(configured), float(max_norm)):
            raise ValueError(
                f"clip_grad_norm_(max_norm={max_norm}) but the DeepSpeed config has gradient_clipping={configured}: "
                "DeepSpeed clips inside backward; set gradient_clipping to the same value"
            )
        norm = self._engine().get_global_grad_norm()
        return torch.as_tensor(0.0 if norm is None else float(norm))

    def _engine(self) -> Any:
        if len(self.engines) != 1:
            raise ValueError("DeepSpeed: prepare the model (with its optimizer and dataloader) before backward")
        return next(iter(self.engines.values()))

    # --- weights -----------------------------------------------------------------------------
    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        engine = self._find_engine(model)
        assert self.plugin.zero_stage is not None  # DeepSpeedPlugin.__post_init__ always sets the stage
        if engine is None or self.plugin.zero_stage < 3:
            return (engine.module if engine is not None else model).state_dict()
        import deepspeed

        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if not self.state.is_main_process:
                return {}
            return {k: v.detach().clone().cpu() for k, v in engine.module.state_dict().items()}

    def _find_engine(self, model: torch.nn.Module) -> Any:
        # The user's module, or the engine itself (whose .module is the user's module).
        return self.engines.get(id(model)) or self.engines.get(id(getattr(model, "module", None)))

    def _engine_of(self, model: torch.nn.Module) -> Any:
        engine = self._find_engine(model)
        if engine is None:
            raise ValueError("DeepSpeed: this model was not prepared by this accelerator")
        return engine

    def save_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, *, writer: bool, safe_serialization: bool = True
    ) -> dict[str, Any]:
        # Shards (or the gathered whole on rank 0) follow this strategy's own rule, not ``writer``; the
        # engine writes its own files whatever safe_serialization says.
        self._engine_of(model).save_checkpoint(str(folder / f"{name}_deepspeed"), tag="state")
        return {"layout": "deepspeed", "strategy": "DEEPSPEED", "zero_stage": self.plugin.zero_stage}

    def load_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, record: dict[str, Any], strict: bool
    ) -> None:
        if record.get("layout") != "deepspeed":
            raise ValueError(
                f"{folder} holds {record.get('layout', 'full')} weights, not a DeepSpeed engine checkpoint; "
                "resume with the strategy that saved it"
            )
        engine = self._engine_of(model)
        loaded, _ = engine.load_checkpoint(
            str(folder / f"{name}_deepspeed"), tag="state", load_module_strict=strict, load_optimizer_states=True
        )
        if loaded is None:
            raise ValueError(f"{folder / (name + '_deepspeed')} holds no DeepSpeed checkpoint tagged 'state'")

    def save_optimizer_files(
        self, folder: Path, name: str, optimizer: Any, model: Any, *, writer: bool
    ) -> dict[str, Any]:
        return {"layout": "deepspeed", "strategy": "DEEPSPEED"}  # inside the engine's checkpoint

    def load_optimizer_files(self, folder: Path, name: str, optimizer: Any, model: Any, record: dict[str, Any]) -> None:
        return None


def fill_auto_values(
    config: dict[str, Any],
    *,
    micro_batch: int | None,
    accumulation: int,
    world_size: int,
    mixed_precision: str,
    clipping: float | None,
    hidden_size: int | None,
) -> int:
    """Replace "auto" in ``config`` from the prepared objects; return the accumulation steps.

    Raises:
        ValueError: a value in the config contradicts the accelerator's; both are named.
    """
    steps = config.get("gradient_accumulation_steps", "auto")
    if steps == "auto":
        steps = accumulation
    elif accumulation != 1 and int(steps) != accumulation:
        raise ValueError(
            f"the DeepSpeed config says gradient_accumulation_steps={steps} but the Accelerator has "
            f'gradient_accumulation_steps={accumulation}; make them agree (or write "auto" in the config)'
        )
    config["gradient_accumulation_steps"] = steps = int(steps)
    micro = config.get("train_micro_batch_size_per_gpu", "auto")
    if micro == "auto":
        if micro_batch is None:
            raise ValueError(
                'train_micro_batch_size_per_gpu is "auto" but no dataloader was prepared with the model; pass the '
                "dataloader to the same prepare call, or set the value in the DeepSpeed config"
            )
        micro = micro_batch
    elif micro_batch is not None and int(micro) != micro_batch:
        raise ValueError(
            f"the DeepSpeed config says train_micro_batch_size_per_gpu={micro} but the prepared dataloader gives "
            f'{micro_batch} samples per process; make them agree (or write "auto")'
        )
    config["train_micro_batch_size_per_gpu"] = micro = int(micro)
    total = config.get("train_batch_size", "auto")
    if total != "auto" and int(total) != micro * steps * world_size:
        raise ValueError(
            f"the DeepSpeed config says train_batch_size={total} but {micro} per process x {steps} accumulation "
            f'steps x {world_size} processes = {micro * steps * world_size}; make them agree (or write "auto")'
        )
    config["train_batch_size"] = micro * steps * world_size
    if config.get("gradient_clipping") == "auto":
        config["gradient_clipping"] = 1.0 if clipping is None else float(clipping)  # Accelerate's default
    for key in ("bf16", "fp16"):
        section = config.get(key)
        wanted = mixed_precision == key
        if section is None:
            if wanted:
                config[key] = {"enabled": True}
            continue
        enabled = section.get("enabled", "auto")
        if enabled == "auto":
            section["enabled"] = wanted
        elif bool(enabled) != wanted:
            raise ValueError(
                f"the DeepSpeed config says {key}.enabled={str(bool(enabled)).lower()} but the Accelerator has "
                f'mixed_precision={mixed_precision!r}; make them agree (or write "auto")'
            )
    zero = config.get("zero_optimization", {})
    for key, formula in _HIDDEN_AUTO.items():
        if zero.get(key) == "auto":
            if hidden_size is None:
                del zero[key]  # DeepSpeed's default
            else:
                zero[key] = formula(hidden_size)
    return steps


def _hidden_size(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    sizes = getattr(config, "hidden_sizes", None)
    if size is None and sizes:
        size = max(sizes)
    return int(size) if size is not None else None
