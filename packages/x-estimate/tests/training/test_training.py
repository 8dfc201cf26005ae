"""Training memory: bytes per parameter for each precision and optimizer, sharding, frozen weights."""

from __future__ import annotations

import pytest
import torch

from x_common.module_sizes import TensorInfo
from x_estimate.model.skeleton import Skeleton
from x_estimate.model.summary import summarize
from x_estimate.training.memory import training_memory

P = 1024 * 1024  # one 1024 x 1024 matrix: a multiple of 256 (adamw8bit blocks)
MATRIX = TensorInfo(("fc.weight",), (1024, 1024), "float32", requires_grad=True)


def _summary_of(model: torch.nn.Module):
    return summarize(Skeleton(model, "torch", type(model).__name__))


# precision -> (weights, gradients, master) bytes per parameter
PRECISION_BYTES = {"fp32": (4, 4, 0), "mixed-bf16": (2, 2, 4), "mixed-fp16": (2, 2, 4), "bf16": (2, 2, 0)}
# (precision, optimizer) -> optimizer state bytes of the 1024 x 1024 matrix
STATE_BYTES = {
    ("fp32", "adamw"): 8 * P,
    ("fp32", "sgd"): 4 * P,
    ("fp32", "adamw8bit"): 2 * P + 2 * 4 * (P // 256),
    ("fp32", "adafactor"): 4 * (1024 + 1024),
    ("mixed-bf16", "adamw"): 8 * P,
    ("mixed-bf16", "sgd"): 4 * P,
    ("mixed-bf16", "adamw8bit"): 2 * P + 2 * 4 * (P // 256),
    ("mixed-bf16", "adafactor"): 4 * (1024 + 1024),
    ("mixed-fp16", "adamw"): 8 * P,
    ("mixed-fp16", "sgd"): 4 * P,
    ("mixed-fp16", "adamw8bit"): 2 * P + 2 * 4 * (P // 256),
    ("mixed-fp16", "adafactor"): 4 * (1024 + 1024),
    ("bf16", "adamw"): 4 * P,
    ("bf16", "sgd"): 2 * P,
    ("bf16", "adamw8bit"): 2 * P + 2 * 4 * (P // 256),
    ("bf16", "adafactor"): 2 * (1024 + 1024),
}


@pytest.mark.parametrize(("precision", "optimizer"), sorted(STATE_BYTES))
def test_bytes_per_parameter_for_each_precision_and_optimizer(precision, optimizer) -> None:
    t = training_memory([MATRIX], precision=precision, optimizer=optimizer)
    w, g, m = PRECISION_BYTES[precision]
    assert (t.parameters, t.weights, t.gradients, t.master) == (P, w * P, g * P, m * P)
    assert t.optimizer_state == STATE_BYTES[(precision, optimizer)]
    assert t.gathered_layer == 0
    assert t.total == (w + g + m) * P + STATE_BYTES[(precision, optimizer)]


def test_headline_bytes_per_parameter() -> None:
    per_param = {
        (p, o): training_memory([MATRIX], precision=p, optimizer=o).bytes_per_param
        for p in ("fp32", "mixed-bf16", "bf16")
        for o in ("adamw", "sgd", "adamw8bit")
    }
    assert per_param[("fp32", "adamw")] == 16.0
    assert per_param[("mixed-bf16", "adamw")] == 16.0  # 2 + 2 + 4 master + 8 (ZeRO paper)
    assert per_param[("bf16", "adamw")] == 8.0
    assert per_param[("fp32", "sgd")] == 12.0
    assert per_param[("bf16", "sgd")] == 6.0
    assert per_param[("fp32", "adamw8bit")] == 8 + 2.03125  # two 8-bit states + a float32 absmax per 256
    assert per_param[("mixed-bf16", "adamw8bit")] == 8 + 2.03125


def test_adafactor_factors_matrices_and_keeps_vectors_whole() -> None:
    tensors = [
        TensorInfo(("w",), (300, 200), "float32", requires_grad=True),
        TensorInfo(("b",), (300,), "float32", requires_grad=True),
        TensorInfo(("conv",), (8, 4, 3, 3), "float32", requires_grad=True),
    ]
    t = training_memory(tensors, precision="fp32", optimizer="adafactor")
    # (300 + 200) row/col factors; the vector in full; the conv weight as 96 rows x (8*4*3) cols.
    assert t.optimizer_state == 4 * (300 + 200) + 4 * 300 + 4 * (8 * 4 * 3 + 8 * 4 * 3)
    assert t.weights == t.gradients == 4 * (300 * 200 + 300 + 8 * 4 * 3 * 3)


# shard -> which parts divide by the 4 devices, for fp32 AdamW on the 1024 x 1024 matrix
@pytest.mark.parametrize(
    ("shard", "weights", "gradients", "state", "gathered"),
    [
        ("none", 4 * P, 4 * P, 8 * P, 0),
        ("zero1", 4 * P, 4 * P, 2 * P, 0),
        ("zero2", 4 * P, P, 2 * P, 0),
        ("zero3", P, P, 2 * P, 4 * 5000),
        ("fsdp", P, P, 2 * P, 4 * 5000),
    ],
)
def test_sharding_over_four_devices(shard, weights, gradients, state, gathered) -> None:
    t = training_memory([MATRIX], shard=shard, num_devices=4, gathered_params=5000)
    assert (t.weights, t.gradients, t.optimizer_state, t.master, t.gathered_layer) == (
        weights,
        gradients,
        state,
        0,
        gathered,
    )
    assert (t.shard, t.num_devices, t.parameters) == (shard, 4, P)


def test_master_copy_divides_from_zero1_and_gathered_layer_is_in_the_weight_dtype() -> None:
    z1 = training_memory([MATRIX], precision="mixed-bf16", shard="zero1", num_devices=8)
    assert (z1.weights, z1.gradients, z1.master, z1.optimizer_state) == (2 * P, 2 * P, 4 * P // 8, 8 * P // 8)
    z3 = training_memory([MATRIX], precision="mixed-bf16", shard="zero3", num_devices=8, gathered_params=1000)
    assert (z3.weights, z3.gradients, z3.master, z3.gathered_layer) == (2 * P // 8, 2 * P // 8, P // 2, 2 * 1000)


def test_one_device_or_no_sharding_divides_nothing() -> None:
    alone = training_memory([MATRIX], shard="zero3", num_devices=1, gathered_params=5000)
    plain = training_memory([MATRIX])
    assert alone.total == plain.total == 16 * P
    assert alone.gathered_layer == 0
    ddp = training_memory([MATRIX], shard="none", num_devices=8, gathered_params=5000)
    assert ddp.total == 16 * P


def test_shards_round_up() -> None:
    odd = TensorInfo(("w",), (3, 3), "float32", requires_grad=True)
    t = training_memory([odd], shard="zero3", num_devices=4)
    assert (t.weights, t.gradients, t.optimizer_state) == (9, 9, 18)  # ceil(36/4), ceil(36/4), ceil(72/4)


def test_frozen_parameters_and_buffers_count_as_weights_only() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 16))
    model[0].requires_grad_(False)
    summary = _summary_of(model)
    trainable = 16 + 16 + 16 * 16 + 16  # BatchNorm affine + second linear
    frozen = 16 * 16 + 16
    buffers_fp32 = 2 * 16 * 4 + 8  # running mean/var, int64 num_batches_tracked
    assert summary.parameters == trainable

    fp32 = training_memory(summary.tensors, precision="fp32", optimizer="adamw")
    assert fp32.parameters == trainable
    assert fp32.weights == 4 * (trainable + frozen) + buffers_fp32
    assert (fp32.gradients, fp32.optimizer_state, fp32.master) == (4 * trainable, 8 * trainable, 0)

    bf16 = training_memory(summary.tensors, precision="mixed-bf16", optimizer="sgd")
    assert bf16.weights == 2 * (trainable + frozen) + 2 * 16 * 2 + 8  # the int64 counter keeps its size
    assert (bf16.gradients, bf16.optimizer_state, bf16.master) == (2 * trainable, 4 * trainable, 4 * trainable)


@pytest.mark.parametrize("shard", ["zero3", "fsdp"])
def test_frozen_parameters_are_sharded_with_the_other_weights(shard) -> None:
    # ZeRO-3 and FSDP partition every parameter, trainable or not (LoRA under ZeRO-3 relies on it):
    # a frozen weight must divide over the devices like the trainable ones.
    frozen = TensorInfo(("base.weight",), (1024, 1024), "float32", requires_grad=False)
    t = training_memory([MATRIX, frozen], shard=shard, num_devices=4)
    assert t.gradients == P  # only the trainable matrix has gradients, sharded
    assert t.weights == (4 * P + 4 * P) // 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": "fp8"}, "unknown precision 'fp8'; expected one of fp32, mixed-bf16, mixed-fp16, bf16"),
        ({"optimizer": "adam"}, "unknown optimizer 'adam'; expected one of adamw, adamw8bit, sgd, adafactor"),
        ({"shard": "zero4"}, "unknown sharding 'zero4'; expected one of none, zero1, zero2, zero3, fsdp"),
        ({"num_devices": 0}, "invalid device count 0: must be >= 1"),
    ],
)
def test_invalid_arguments(kwargs, message) -> None:
    with pytest.raises(ValueError) as exc:
        training_memory([MATRIX], **kwargs)
    assert str(exc.value) == message


def test_cli_precision_and_optimizer_apply_to_every_row(model_dir, configs, cli) -> None:
    n = 172_288  # tiny GPT-2, tied head
    data = cli(model_dir(configs.gpt2()), "--precision", "bf16", "--optimizer", "sgd", "--json").json
    trained = [r for r in data["rows"] if r["training"] is not None]
    assert [r["dtype"] for r in trained] == ["float32", "float16", "bfloat16"]
    for row in trained:
        t = row["training"]
        assert (t["precision"], t["optimizer"]) == ("bf16", "sgd")
        assert (t["weights"], t["gradients"], t["optimizer_state"], t["master"]) == (2 * n, 2 * n, 2 * n, 0)
        assert t["total"] == 6 * n and t["bytes_per_param"] == 6.0
    assert [r["training"] for r in data["rows"] if r["dtype"] in ("int8", "int4")] == [None, None]
    assert data["options"]["precision"] == "bf16" and data["options"]["optimizer"] == "sgd"


def test_cli_auto_precision_per_row(model_dir, configs, cli) -> None:
    n = 172_288
    rows = {r["dtype"]: r["training"] for r in cli(model_dir(configs.gpt2()), "--json").json["rows"]}
    assert rows["float32"]["precision"] == "fp32"
    assert rows["float16"]["precision"] == "mixed-fp16"
    assert rows["bfloat16"]["precision"] == "mixed-bf16"
    assert rows["float32"]["total"] == rows["float16"]["total"] == rows["bfloat16"]["total"] == 16 * n
    assert rows["bfloat16"]["master"] == 4 * n


def test_cli_sharded_training_header_and_breakdown(model_dir, configs, cli) -> None:
    folder = model_dir(configs.gpt2())
    data = cli(folder, "--num-gpus", "4", "--shard", "zero3", "--dtypes", "float32", "--json").json
    t = data["rows"][0]["training"]
    n = 172_288
    block = 2 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 2 * 64 + 64 * 256 + 256 + 256 * 64 + 64  # one GPT2Block
    assert (t["weights"], t["gradients"], t["optimizer_state"]) == (n, n, 2 * n)
    # Gathered at the peak: the root unit (the tied wte once, wpe, ln_f) and one GPT2Block.
    root = 1000 * 64 + 128 * 64 + 2 * 64
    assert t["gathered_layer"] == (root + block) * 4
    text = cli(folder, "--num-gpus", "4", "--shard", "zero3", "--dtypes", "float32").out
    assert "| Training (adamw, per device, zero3 over 4) |" in text
    assert "+ gathered layer 477.75 KiB = " in text
