"""Accelerate's ``fsdp_reshard_after_forward`` key, which two FSDP versions spell differently.

FSDP2 (``fully_shard``) takes a boolean. Accelerate's FSDP1 configs write a sharding strategy
name (``FULL_SHARD``, ``SHARD_GRAD_OP``, ...) into the same key. The launcher and the runtime
split and translate it here, once, so that they cannot disagree.

Examples:
    >>> split_reshard_after_forward(False)
    (False, None)
    >>> split_reshard_after_forward("SHARD_GRAD_OP")
    (None, 'SHARD_GRAD_OP')
    >>> reshard_after_forward_for("full_shard"), reshard_after_forward_for("NO_SHARD")
    (True, None)
"""

from __future__ import annotations

from typing import Any

from x_common import env

__all__ = [
    "RESHARD_AFTER_FORWARD_BY_STRATEGY",
    "reshard_after_forward_for",
    "reshard_variables",
    "split_reshard_after_forward",
]

# The FSDP1 strategies that fully_shard can run, as its reshard_after_forward flag.
RESHARD_AFTER_FORWARD_BY_STRATEGY = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}


def split_reshard_after_forward(value: bool | str | None) -> tuple[bool | None, str | None]:
    """``(reshard_after_forward, sharding_strategy)`` from the key's value; the other one is ``None``.

    A string is an FSDP1 strategy name, spelled as ``x_common.env.FSDP_SHARDING_STRATEGIES`` does.

    Raises:
        ValueError: a string that names no FSDP1 strategy.
    """
    if value is None or isinstance(value, bool):
        return value, None
    return None, env.FSDP_SHARDING_STRATEGY.kind.parse("fsdp_reshard_after_forward", value)


def reshard_after_forward_for(strategy: str) -> bool | None:
    """``fully_shard``'s ``reshard_after_forward`` for an FSDP1 strategy; ``None`` when it has none."""
    return RESHARD_AFTER_FORWARD_BY_STRATEGY.get(strategy.strip().upper())


def reshard_variables(value: bool | str) -> dict[env.EnvVar, Any]:
    """The contract variable that carries the key's value: a bool as itself, a name as the strategy.

    Examples:
        >>> reshard_variables("SHARD_GRAD_OP") == {env.FSDP_SHARDING_STRATEGY: "SHARD_GRAD_OP"}
        True
        >>> reshard_variables(False) == {env.FSDP_RESHARD_AFTER_FORWARD: False}
        True
    """
    reshard, strategy = split_reshard_after_forward(value)
    if strategy is not None:
        return {env.FSDP_SHARDING_STRATEGY: strategy}
    return {env.FSDP_RESHARD_AFTER_FORWARD: reshard}
