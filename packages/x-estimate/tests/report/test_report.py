"""The printed table and its JSON twin, with BERT-base as the reference model."""

from __future__ import annotations

import pytest

BERT_BASE_BYTES = 433_249_280  # 108,310,272 float32 parameters + two 512-long int64 buffers
BERT_BASE_PARAMS = 108_310_272


@pytest.fixture
def bert_base(model_dir):
    from transformers import BertConfig

    return model_dir(BertConfig(vocab_size=28996), name="bert-base-cased")


def test_bert_base_numbers_in_json(bert_base, cli) -> None:
    data = cli(bert_base, "--base-model", "--json").json
    assert (data["class"], data["library"], data["source"]) == ("BertModel", "transformers", "local folder")
    assert data["parameters"] == BERT_BASE_PARAMS
    rows = {r["dtype"]: r for r in data["rows"]}
    assert list(rows) == ["float32", "float16", "bfloat16", "int8", "int4"]
    f32 = rows["float32"]
    assert f32["total_bytes"] == BERT_BASE_BYTES == BERT_BASE_PARAMS * 4 + 2 * 512 * 8
    assert f32["largest_layer"] == {"name": "embeddings", "bytes": 90_669_056}
    t = f32["training"]
    assert (t["precision"], t["optimizer"], t["shard"], t["num_devices"]) == ("fp32", "adamw", "none", 1)
    assert t["parameters"] == BERT_BASE_PARAMS
    assert t["weights"] == BERT_BASE_BYTES
    assert t["gradients"] == 4 * BERT_BASE_PARAMS
    assert t["optimizer_state"] == 8 * BERT_BASE_PARAMS
    assert (t["master"], t["gathered_layer"]) == (0, 0)
    assert t["total"] == BERT_BASE_BYTES + 12 * BERT_BASE_PARAMS == 1_732_972_544
    assert t["bytes_per_param"] == round(1_732_972_544 / BERT_BASE_PARAMS, 4)
    assert rows["float16"]["total_bytes"] == rows["bfloat16"]["total_bytes"] == BERT_BASE_PARAMS * 2 + 8192


def test_bert_base_numbers_in_the_text_table(bert_base, cli, parse_table) -> None:
    result = cli(bert_base, "--base-model")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == (
        f"Memory for `{bert_base}`: BertModel (transformers, the bare base model (--base-model), "
        "as Accelerate builds it; from local folder)"
    )
    assert lines[1] == "108,310,272 trainable parameters"
    table = parse_table(result.out)
    assert table["dtype"] == ["Largest Layer", "Total Size", "Training (adamw)"]
    assert table["float32"] == ["86.47 MiB", "413.18 MiB", "1.61 GiB"]
    assert table["float16"] == ["43.24 MiB", "206.59 MiB", "1.61 GiB"]
    assert table["bfloat16"] == ["43.24 MiB", "206.59 MiB", "1.61 GiB"]
    assert table["int8"][2] == table["int4"][2] == "-"
    assert "Largest layer: embeddings, the largest unit a device map keeps whole." in lines
    assert (
        "  float32 (fp32): weights 413.18 MiB + gradients 413.17 MiB + optimizer state 826.34 MiB"
        " = 1.61 GiB (16.00 B/param)"
    ) in lines
    assert (
        "  bfloat16 (mixed-bf16): weights 206.59 MiB + gradients 206.59 MiB + optimizer state 826.34 MiB"
        " + fp32 master 413.17 MiB = 1.61 GiB (16.00 B/param)"
    ) in lines
    # The markdown table is aligned: every table line has the same width.
    widths = {len(line) for line in lines if line.startswith("|")}
    assert len(widths) == 1


def test_json_structure(bert_base, cli) -> None:
    data = cli(bert_base, "--base-model", "--dtypes", "float32", "int8", "--seq-len", "16", "--json").json
    assert set(data) == {"model", "library", "class", "source", "parameters", "options", "rows", "assumptions"}
    assert data["model"] == str(bert_base)
    assert data["options"] == {
        "optimizer": "adamw",
        "precision": "auto",
        "int4_format": "nf4",
        "num_gpus": 1,
        "shard": "none",
        "seq_len": 16,
        "batch_size": 1,
        "fits": None,
        "method": "simulate",  # --seq-len given: auto simulates
        "attn_implementation": None,
        "activation_checkpointing": False,
        "free_outputs": False,
        "device": "cpu",  # the CPU's kernels unless --device cuda or --fits
    }
    assert [r["dtype"] for r in data["rows"]] == ["float32", "int8"]
    for row in data["rows"]:
        assert set(row) == {
            "dtype",
            "largest_layer",
            "total_bytes",
            "training",
            "kv_cache_bytes",
            "activation_bytes",
            "activation_bytes_checkpointed",
            "fits",
        }
        assert set(row["largest_layer"]) == {"name", "bytes"}
        assert row["fits"] == {"inference": None, "training": None, "training_checkpointed": None}
    assert set(data["rows"][0]["training"]) == {
        "precision",
        "optimizer",
        "shard",
        "num_devices",
        "parameters",
        "weights",
        "gradients",
        "optimizer_state",
        "master",
        "gathered_layer",
        "total",
        "bytes_per_param",
        "method",
        "activation_peak_bytes",
        "peak_bytes",
        "reserved_bytes",
        "at_peak",
        "steady_bytes",
        "peak_phase",
        "notes",
    }
    training = data["rows"][0]["training"]
    assert training["method"] == "simulate"
    assert training["reserved_bytes"] is None  # a CUDA simulation's figure only
    assert set(training["at_peak"]) == {
        "weights", "gradients", "optimizer_state", "activations", "logits", "temporaries", "master", "gathered_layer"
    }  # fmt: skip
    assert sum(training["at_peak"].values()) == training["peak_bytes"]
    assert data["rows"][1]["training"] is None
    assert all(isinstance(a, str) and a for a in data["assumptions"])


def test_fits_one_gib(bert_base, cli, parse_table) -> None:
    result = cli(bert_base, "--base-model", "--fits", "1GiB")
    table = parse_table(result.out)
    assert table["dtype"][-1] == "Fits 1.00 GiB"
    assert table["float32"][-1] == "load yes, train no"
    assert table["float16"][-1] == "load yes, train no"
    assert table["int4"][-1] == "load yes, train -"

    data = cli(bert_base, "--base-model", "--fits", "1GiB", "--json").json
    assert data["options"]["fits"] == 2**30
    fits = {r["dtype"]: r["fits"] for r in data["rows"]}
    assert fits["float32"] == {"inference": True, "training": False, "training_checkpointed": None}
    assert fits["int8"] == {"inference": True, "training": None, "training_checkpointed": None}


def test_fits_boundaries_are_inclusive_and_count_kv_and_activations(model_dir, configs, cli, parse_table) -> None:
    folder = model_dir(configs.gpt2())
    n = 172_288

    def fits(*args):  # the formulas: their figures are known in closed form
        return cli(folder, "--dtypes", "float32", "--method", "formula", *args, "--json").json["rows"][0]

    assert fits("--fits", n * 4)["fits"] == {"inference": True, "training": False, "training_checkpointed": None}
    assert fits("--fits", n * 4 - 1)["fits"]["inference"] is False
    assert fits("--fits", 16 * n)["fits"] == {"inference": True, "training": True, "training_checkpointed": None}
    # With 64 tokens the KV cache joins loading, and activations join training.
    kv = 2 * 4 * 16 * 64 * 2 * 4
    row = fits("--seq-len", 64, "--fits", n * 4 + kv)
    assert row["kv_cache_bytes"] == kv
    assert row["fits"]["inference"] is True
    assert fits("--seq-len", 64, "--fits", n * 4 + kv - 1)["fits"]["inference"] is False
    acts, ckpt = row["activation_bytes"], row["activation_bytes_checkpointed"]
    assert (acts, ckpt) == (2 * 2 * (64 * 64 * 34 + 5 * 4 * 64 * 64), 2 * 2 * 2 * 64 * 64)  # fp32: twice 16-bit
    assert fits("--seq-len", 64, "--fits", 16 * n + acts)["fits"] == {
        "inference": True,
        "training": True,
        "training_checkpointed": True,
    }
    # Enough for checkpointed activations only: the table says so.
    budget = 16 * n + ckpt
    assert fits("--seq-len", 64, "--fits", budget)["fits"] == {
        "inference": True,
        "training": False,
        "training_checkpointed": True,
    }
    text = cli(folder, "--dtypes", "float32", "--method", "formula", "--seq-len", 64, "--fits", budget).out
    assert parse_table(text)["float32"][-1] == "load yes, train no (yes with activation checkpointing)"


@pytest.mark.parametrize("size", ["40GB", "1.5 GiB", "1024"])
def test_fits_accepts_sizes(size, model_dir, configs, cli) -> None:
    from x_common.sizes import parse_size

    data = cli(model_dir(configs.gpt2()), "--dtypes", "float32", "--fits", size, "--json").json
    assert data["options"]["fits"] == parse_size(size)


def test_assumptions_are_printed(bert_base, cli) -> None:
    out = cli(bert_base, "--base-model", "--dtypes", "float32", "int4", "--int4", "gptq").out
    assert "- Total Size: parameters and buffers, tied weights once; binary units (1 MiB = 2^20 bytes)." in out
    assert "int4 (gptq): 73 weights" in out
    assert "embeddings, norms, biases and the output head stay float16" in out


def test_dtypes_select_and_order_rows(model_dir, configs, cli) -> None:
    folder = model_dir(configs.gpt2())
    rows = cli(folder, "--dtypes", "int4", "--dtypes", "float16", "--dtypes", "int4", "--json").json["rows"]
    assert [r["dtype"] for r in rows] == ["int4", "float16"]
    rows = cli(folder, "--dtypes", "float32,bfloat16", "--json").json["rows"]
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    rows = cli(folder, "--dtypes=float16,int8", "--json").json["rows"]
    assert [r["dtype"] for r in rows] == ["float16", "int8"]
    # Accelerate's spelling: several values after one --dtypes.
    rows = cli(folder, "--dtypes", "float32", "float16", "--json").json["rows"]
    assert [r["dtype"] for r in rows] == ["float32", "float16"]
