"""int8/int4 rows: only linear weights quantized, with their scales; the rest stays float16."""

from __future__ import annotations

import math

import pytest
import torch

from x_estimate.model.quantized import quantized_sizes
from x_estimate.model.skeleton import Skeleton
from x_estimate.model.summary import summarize
from x_estimate.report.table import Options, build_report


class TinyNet(torch.nn.Module):
    """An embedding, one Linear(256, 128) with bias, a LayerNorm and an untied output head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 256)
        self.fc = torch.nn.Linear(256, 128)
        self.norm = torch.nn.LayerNorm(128)
        self.head = torch.nn.Linear(128, 10, bias=False)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


def _summary(model: torch.nn.Module):
    return summarize(Skeleton(model, "torch", type(model).__name__))


# float16 bytes of everything but fc.weight: embedding, fc bias, LayerNorm, head
KEPT = 2 * (1000 * 256 + 128 + 2 * 128 + 10 * 128)
N = 128 * 256  # fc.weight values

FC_WEIGHT = {
    "int8": N + 4 * 128,  # int8 values + a float32 scale per output row
    "nf4": N // 2 + 4 * (N // 64),  # packed 4-bit + float32 absmax per 64
    "nf4-dq": N // 2 + N // 64 + 4 * math.ceil(N // 64 / 256),  # 8-bit absmax + float32 per 256 blocks
    "gptq": N // 2 + 2 * 128 * 2 + (2 * 128) // 2 + 4 * 256,  # 2 groups of 128: fp16 scales, 4-bit zeros, g_idx
    "awq": N // 2 + 2 * 128 * 2 + (2 * 128) // 2,
}


@pytest.mark.parametrize("fmt", sorted(FC_WEIGHT))
def test_exact_bytes_on_a_hand_computable_model(fmt) -> None:
    summary = _summary(TinyNet())
    assert summary.linear == {"fc.weight": (128, 256)}  # the head is not a quantization target
    sizes, count = quantized_sizes(summary, fmt)
    assert count == 1
    assert sizes["fc.weight"] == FC_WEIGHT[fmt]
    assert sizes["fc"] == FC_WEIGHT[fmt] + 2 * 128
    assert sizes["embed"] == 2 * 1000 * 256
    assert sizes["norm"] == 2 * 2 * 128
    assert sizes["head"] == 2 * 10 * 128
    assert sizes[""] == KEPT + FC_WEIGHT[fmt]


def test_hand_numbers() -> None:
    # The same figures written out, so a formula change cannot hide behind FC_WEIGHT.
    assert FC_WEIGHT == {"int8": 33280, "nf4": 18432, "nf4-dq": 16904, "gptq": 18048, "awq": 17024}


@pytest.mark.parametrize("fmt", ["nf4", "nf4-dq", "gptq", "awq"])
def test_report_int4_row_uses_the_chosen_format(fmt) -> None:
    summary = _summary(TinyNet())
    options = Options(int4=fmt)
    report = build_report(summary, name="tiny", origin="test", options=options)
    rows = {r.dtype: r for r in report.rows}
    assert rows["int8"].total == KEPT + FC_WEIGHT["int8"]
    assert rows["int4"].total == KEPT + FC_WEIGHT[fmt]
    assert rows["int8"].training is None and rows["int4"].training is None
    assert report.as_dict()["options"]["int4_format"] == fmt
    assert f"int4 ({fmt}): 1 weights" in report.as_text()


def test_tied_linear_weight_is_not_quantized() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(128, 256)
            self.proj = torch.nn.Linear(256, 128, bias=False)
            self.proj.weight = self.embed.weight

    summary = _summary(Tied())
    assert summary.linear == {"proj.weight": (128, 256)}
    for fmt in ("int8", "nf4"):
        sizes, count = quantized_sizes(summary, fmt)
        assert count == 0
        assert sizes[""] == sizes["proj"] == sizes["embed"] == 2 * 128 * 256


def test_gpt2_tied_head_and_conv1d(model_dir, configs, cli) -> None:
    from transformers import GPT2LMHeadModel

    config = configs.gpt2()
    real = GPT2LMHeadModel(config)
    conv1d = [m.weight for m in real.modules() if type(m).__name__ == "Conv1D"]
    assert len(conv1d) == 8  # c_attn, c_proj, c_fc, c_proj per block
    total16 = 2 * 172_288
    expected_int8 = total16 + sum(w.shape[1] * w.shape[0] + 4 * w.shape[1] - 2 * w.numel() for w in conv1d)
    rows = {r["dtype"]: r for r in cli(model_dir(config), "--json").json["rows"]}
    assert rows["float16"]["total_bytes"] == total16
    assert rows["int8"]["total_bytes"] == expected_int8
    text = cli(model_dir(config, name="again")).out
    assert "int8 (LLM.int8, float32 row scales): 8 weights, int4 (nf4): 8 weights" in text


def test_bert_base_quantized_rows_against_its_linear_layers(model_dir, cli) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=28996)
    with torch.device("meta"):
        real = BertModel._from_config(config, dtype=torch.float32)
    linears = [m for m in real.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 73
    data = cli(model_dir(config), "--base-model", "--json").json
    rows = {r["dtype"]: r for r in data["rows"]}
    f16 = rows["float16"]["total_bytes"]
    int8 = f16 + sum(m.out_features * m.in_features + 4 * m.out_features - 2 * m.weight.numel() for m in linears)
    nf4 = f16 + sum(
        math.ceil(m.weight.numel() / 2) + 4 * math.ceil(m.weight.numel() / 64) - 2 * m.weight.numel() for m in linears
    )
    assert rows["int8"]["total_bytes"] == int8
    assert rows["int4"]["total_bytes"] == nf4


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match=r"unknown quantization format 'int2'; expected int8 or one of nf4, nf4-dq"):
        quantized_sizes(_summary(TinyNet()), "int2")
