"""How the prepared model is distributed: one module per strategy.

``ddp`` (also single-process), ``fsdp`` (FSDP2 ``fully_shard``) and ``deepspeed``; ``dynamo``
compiles whatever a strategy returns and ``fp8`` checks and applies the fp8 recipe. The
accelerator asks ``select.choose_strategy`` for one object and routes model wrapping, optimizer
setup, backward, gradient clipping, state dicts and checkpoint files through it.
"""
