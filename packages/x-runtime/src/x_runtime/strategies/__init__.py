"""How the prepared model is distributed: one class per strategy, behind the ``Strategy`` Protocol.

``base`` holds the seam: the ``Strategy`` Protocol the accelerator types against, and the
``Replacements`` a strategy returns from ``finish_prepare`` for the accelerator to apply.
``defaults`` is plain PyTorch's answer to every hook, mixed into the strategies: ``ddp`` (also
single-process), ``fsdp`` (FSDP2 ``fully_shard``, options in ``fsdp_plugin``), ``deepspeed``
(options in ``deepspeed_plugin``) and ``xla`` (torch_xla replicas, fed by ``xla_loader``).
``select`` decides which one runs and how the process group is joined (the one place that does);
``param_moves`` points optimizers built before ``prepare`` at parameters a strategy replaced
(strategy bookkeeping: FSDP and XLA replace parameters). ``unwrap_model`` (``core.unwrap``) finds
the user's model inside the wrappers.
"""

from x_runtime.core.unwrap import unwrap_model
from x_runtime.strategies.base import Replacements, Strategy
from x_runtime.strategies.ddp import DDPStrategy
from x_runtime.strategies.deepspeed_plugin import DeepSpeedPlugin
from x_runtime.strategies.defaults import StrategyDefaults
from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin
from x_runtime.strategies.select import StrategyChoice, decide

__all__ = [
    "DDPStrategy",
    "DeepSpeedPlugin",
    "FullyShardedDataParallelPlugin",
    "Replacements",
    "Strategy",
    "StrategyChoice",
    "StrategyDefaults",
    "decide",
    "unwrap_model",
]
