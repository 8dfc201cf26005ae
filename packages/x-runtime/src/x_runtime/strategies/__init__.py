"""How the prepared model is distributed: one module per strategy.

``ddp`` (also single-process), ``fsdp`` (FSDP2 ``fully_shard``), ``deepspeed`` and ``xla``
(torch_xla replicas, fed by ``xla_loader``); ``dynamo`` compiles whatever a strategy returns,
``fp8`` checks and applies the fp8 recipe, and ``param_moves`` points optimizers built before
``prepare`` at parameters a strategy replaced. The
accelerator asks ``select.choose_strategy`` for one object and routes model wrapping, optimizer
setup, backward, gradient clipping, state dicts and checkpoint files through it.
"""
