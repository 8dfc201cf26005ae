"""DeepSpeed ZeRO stages 0-3: the engine built in ``prepare``, "auto" values filled, checkpoints
through the engine.

As in Accelerate, ``backward`` tells the engine whether this micro-batch ends an accumulation
(``gradient_state.sync_gradients``: the ``accumulate`` context, or transformers' Trainer, decides),
runs ``engine.backward`` and, on a boundary, ``engine.step`` (which clips to the config's
``gradient_clipping``); the prepared optimizer's ``step``/``zero_grad`` do nothing. DeepSpeed
divides the loss by the accumulation steps itself, so the accelerator does not. When the config
names the optimizer or the scheduler, ``DummyOptim``/``DummyScheduler`` stand in for them in
``prepare`` and come back as ``DeepSpeedOptimizerWrapper``/``DeepSpeedSchedulerWrapper``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from x_common import env
from x_runtime.core.settings import current_settings
from x_runtime.data.gradient_state import GradientState
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler
from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.base import Replacements
from x_runtime.strategies.deepspeed_plugin import DeepSpeedPlugin
from x_runtime.strategies.deepspeed_standins import (
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)
from x_runtime.strategies.defaults import StrategyDefaults

__all__ = ["DeepSpeedStrategy", "fill_auto_values"]

_INSTALL = "pip install 'x-runtime[deepspeed]'"
logger = logging.getLogger(__name__)
_HIDDEN_AUTO: dict[str, Callable[[int], int]] = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}


class DeepSpeedStrategy(StrategyDefaults):
    distributed_type = "DEEPSPEED"
    scales_loss_for_accumulation = True
    writes_from_state_dicts = False  # the engine writes its own sharded files, with collectives

    def __init__(
        self,
        state: ProcessState,
        plugin: DeepSpeedPlugin | None,
        mixed_precision: str,
        gradient_state: GradientState | None = None,
    ):
        self.state = state
        self.gradient_state = gradient_state or GradientState()
        if state.device.type == "cpu" and not current_settings().is_set(env.DS_ACCELERATOR):
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
        self._warned_clipping = False

    # --- prepare -----------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # the engine places it

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        return model  # the engine is built in finish_prepare, once the optimizer and loader are known

    def finish_prepare(self, prepared: Sequence[Any], *, accumulation_steps: int) -> Replacements:
        """Build the engine from the model, its optimizer (or ``DummyOptim``) and its loader; it replaces
        the model, and its optimizer and scheduler step inside ``backward``."""
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
        stand_in = next((i for i, obj in enumerate(prepared) if isinstance(obj, DummyOptim)), None)
        schedule = next((i for i, obj in enumerate(prepared) if isinstance(obj, DummyScheduler)), None)
        loaders = [obj for obj in prepared if isinstance(obj, torch.utils.data.DataLoader)]
        config = self.plugin.config
        _check_stand_ins(config, prepared, optimizers, stand_in, schedule)
        if optimizers:
            config["zero_allow_untested_optimizer"] = True  # a torch optimizer, as Accelerate allows
        steps = fill_auto_values(
            config,
            micro_batch=loaders[0].batch_size if loaders else None,
            accumulation=accumulation_steps,
            world_size=self.state.world_size,
            mixed_precision=self.mixed_precision,
            clipping=self.plugin.gradient_clipping,
            hidden_size=_hidden_size(model),
        )
        kwargs: dict[str, Any] = {"model": model, "config": config}
        if stand_in is not None:
            dummy = prepared[stand_in]
            _fill(config, {"optimizer.params.lr": dummy.lr, "optimizer.params.weight_decay": dummy.weight_decay})
            kwargs["model_parameters"] = dummy.params
        else:
            client = prepared[optimizers[0]].optimizer if optimizers else None
            kwargs["optimizer"] = client
            if client is None:
                kwargs["model_parameters"] = model.parameters()
        if schedule is not None:
            dummy_schedule = prepared[schedule]
            if dummy_schedule.lr_scheduler_callable is not None:
                kwargs["lr_scheduler"] = dummy_schedule.lr_scheduler_callable
            else:
                _fill(config, _schedule_values(dummy_schedule, self.state.world_size))
        engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(**kwargs)
        self.engines[id(model)] = engine
        built: dict[int, Any] = {}
        if stand_in is not None:
            built[stand_in] = DeepSpeedOptimizerWrapper(ds_optimizer, self.gradient_state)
        if schedule is not None:
            wrapped = [built[stand_in]] if stand_in is not None else []
            built[schedule] = DeepSpeedSchedulerWrapper(ds_scheduler, wrapped, self.gradient_state)
        return Replacements(
            models={models[0]: engine},
            optimizers=dict.fromkeys(optimizers, ds_optimizer),
            stand_ins=built,
            num_steps=steps,
        )

    # --- the step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: Any, **kwargs: Any) -> None:
        engine = self._engine()
        boundary = self.gradient_state.sync_gradients
        engine.set_gradient_accumulation_boundary(is_boundary=boundary)
        engine.backward(loss, **kwargs)
        if boundary:
            engine.step()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """The engine's global gradient norm: DeepSpeed clips inside its step, to the config's ``gradient_clipping``."""
        configured = self.plugin.config.get("gradient_clipping")
        if (
            configured not in (None, "auto")
            and math.isfinite(max_norm)
            and not math.isclose(float(configured), max_norm)
        ) and not self._warned_clipping:
            self._warned_clipping = True
            logger.warning(
                "clip_grad_norm_(max_norm=%s): DeepSpeed clips to gradient_clipping=%s from its config; "
                "set the two alike",
                max_norm,
                configured,
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

        if not engine.zero_gather_16bit_weights_on_model_save():
            raise ValueError(
                "ZeRO-3 keeps each weight in shards, and the DeepSpeed config does not ask to gather them when saving: "
                "set zero_optimization.stage3_gather_16bit_weights_on_model_save to true (zero3_save_16bit_model=True), "
                "or save the engine's own checkpoint (save_state) and merge it with zero_to_fp32.py"
            )
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


def _fill(config: dict[str, Any], values: dict[str, Any]) -> None:
    """Fill the "auto" entries at the dotted keys of ``values``; entries set in the config stay as written."""
    for dotted, value in values.items():
        *parents, key = dotted.split(".")
        node: Any = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(key) == "auto":
            node[key] = value


def _schedule_values(schedule: DummyScheduler, world_size: int) -> dict[str, Any]:
    """What a ``DummyScheduler`` fills into the config's scheduler section, as Accelerate fills it."""
    optimizer = schedule.optimizer
    defaults = getattr(optimizer, "defaults", None)
    values: dict[str, Any] = {
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": defaults["lr"] if defaults is not None else getattr(optimizer, "lr", None),
        "scheduler.params.warmup_num_steps": max(1, schedule.warmup_num_steps),  # DeepSpeed 0.19.6+ refuses 0
    }
    if schedule.total_num_steps is not None:
        values["scheduler.params.total_num_steps"] = math.ceil(schedule.total_num_steps / world_size)
    return values


def _check_stand_ins(
    config: dict[str, Any], prepared: Sequence[Any], optimizers: list[int], stand_in: int | None, schedule: int | None
) -> None:
    """The optimizer and scheduler come from the code or from the config, not both (Accelerate's rules)."""
    if optimizers and "optimizer" in config:
        raise ValueError(
            f"the DeepSpeed config names an optimizer ({config['optimizer'].get('type')}) and a torch optimizer "
            "was prepared too; drop one of them (or prepare a DummyOptim)"
        )
    if stand_in is not None and "optimizer" not in config:
        raise ValueError("a DummyOptim was prepared, but the DeepSpeed config has no optimizer section to build from")
    schedulers = [obj for obj in prepared if isinstance(obj, AcceleratedScheduler)]
    if schedulers and "scheduler" in config:
        raise ValueError(
            "the DeepSpeed config names a scheduler and a torch scheduler was prepared too; drop one of them "
            "(or prepare a DummyScheduler)"
        )
    if schedule is not None:
        if "scheduler" not in config and prepared[schedule].lr_scheduler_callable is None:
            raise ValueError(
                "a DummyScheduler was prepared with no lr_scheduler_callable and the DeepSpeed config has no "
                "scheduler section: give one of them"
            )
        if stand_in is None and optimizers:
            raise ValueError("a DummyScheduler goes with a DummyOptim, not with a torch optimizer")
