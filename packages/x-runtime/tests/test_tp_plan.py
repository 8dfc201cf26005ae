"""Tensor-parallel plans: read from a transformers model or given by the user, checked before anything is split."""

from __future__ import annotations

import pytest
import torch

from x_runtime.strategies.layout import BadLayoutError
from x_runtime.strategies.tp_plan import STYLES, model_plan, resolve_plan

transformers = pytest.importorskip("transformers")


def _llama(heads: int = 4, kv_heads: int = 2) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=256,
    )
    return transformers.LlamaForCausalLM(config)


class Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.Linear(12, 8)) for _ in range(2)
        )


def test_a_transformers_model_carries_its_plan_keyed_from_its_root() -> None:
    plan = model_plan(_llama())
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.*.mlp.down_proj"] == "rowwise"
    resolved = resolve_plan(_llama(), None, 2)
    # Every matched module gets torch's style: 7 projections x 2 layers, and the plan's head and embedding.
    assert len([name for name in resolved if name.startswith("model.layers.")]) == 14
    assert type(resolved["model.layers.1.self_attn.o_proj"]).__name__ == "RowwiseParallel"
    assert all(word in STYLES for word in set(plan.values()))


def test_a_users_plan_takes_words_or_torch_styles() -> None:
    from torch.distributed.tensor.parallel import RowwiseParallel

    resolved = resolve_plan(Blocks(), {"blocks.*.0": "colwise", "blocks.*.1": RowwiseParallel()}, 4)
    assert sorted(resolved) == ["blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1"]
    assert type(resolved["blocks.1.0"]).__name__ == "ColwiseParallel"


@pytest.mark.parametrize(
    ("plan", "tp", "message"),
    [
        (
            {"blocks.*.up": "colwise"},
            2,
            "tensor parallelism: the plan names 'blocks.*.up' but Blocks has no such module; "
            "fix the plan's module names (printed by model.named_modules())",
        ),
        (
            {"blocks.*.0": "packed_colwise"},
            2,
            "tensor parallelism: blocks.0.0: x does not split 'packed_colwise' layers (it splits colwise, "
            "colwise_gather_output, colwise_rep, embedding_rowwise, rowwise, rowwise_rep, sequence_parallel); "
            "give that module a torch ParallelStyle in the plan or leave it out",
        ),
        (
            {"blocks.*.0": "colwise"},
            8,
            "tensor parallelism: blocks.0.0 (ColwiseParallel) has 12 rows in its weight, which tp_size=8 does "
            "not divide; pick a tp_size that divides 12",
        ),
        (
            {"blocks.*": "colwise"},
            2,
            "tensor parallelism: blocks.0 is a Sequential; ColwiseParallel splits Linear and Embedding layers only",
        ),
    ],
)
def test_what_a_plan_cannot_split_is_one_line(plan: dict, tp: int, message: str) -> None:
    with pytest.raises(BadLayoutError) as raised:
        resolve_plan(Blocks(), plan, tp)
    assert str(raised.value) == message


def test_heads_and_a_missing_plan_are_refused() -> None:
    with pytest.raises(
        BadLayoutError, match=r"^tensor parallelism: the model's num_key_value_heads=2 is not divisible by tp_size=4; "
    ):
        resolve_plan(_llama(heads=4, kv_heads=2), None, 4)
    with pytest.raises(
        BadLayoutError, match=r"^tensor parallelism \(tp_size=2\): Blocks carries no tensor-parallel plan; pass one as "
    ):
        resolve_plan(Blocks(), None, 2)
