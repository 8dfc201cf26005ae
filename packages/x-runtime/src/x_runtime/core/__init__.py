"""The leaf of x_runtime: what every layer may use and which uses nothing of x_runtime.

``configs`` (Accelerate's dataclasses and kwargs handlers), ``nested`` (walking nested batches),
``unwrap`` (the user's model inside DDP and torch.compile), ``random_state`` (seeding and
capturing generators), ``memory`` (recovering from out-of-memory), ``imports`` (the
``is_*_available`` checks), ``environment`` (``patch_environment``) and ``system`` (the kernel check).
"""
