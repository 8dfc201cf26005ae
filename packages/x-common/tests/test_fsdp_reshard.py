"""``x_common.fsdp_reshard``: Accelerate's ``fsdp_reshard_after_forward``, split and translated once."""

from __future__ import annotations

import pytest

from x_common import env
from x_common.fsdp_reshard import reshard_after_forward_for, reshard_variables, split_reshard_after_forward


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, (True, None)), (False, (False, None)), (None, (None, None)), ("hybrid_shard", (None, "HYBRID_SHARD"))],
)
def test_split(value, expected) -> None:
    assert split_reshard_after_forward(value) == expected


def test_split_refuses_a_name_that_is_no_strategy() -> None:
    with pytest.raises(ValueError, match="expected one of FULL_SHARD, SHARD_GRAD_OP"):
        split_reshard_after_forward("HALF_SHARD")


def test_translation_covers_what_fully_shard_runs() -> None:
    assert [reshard_after_forward_for(s) for s in env.FSDP_SHARDING_STRATEGIES] == [True, False, None, None, None]


def test_variables() -> None:
    assert reshard_variables(True) == {env.FSDP_RESHARD_AFTER_FORWARD: True}
    assert reshard_variables("FULL_SHARD") == {env.FSDP_SHARDING_STRATEGY: "FULL_SHARD"}
