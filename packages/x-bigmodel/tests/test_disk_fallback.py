"""An offload folder makes disk the last device: ``load_checkpoint_and_dispatch(..., device_map="auto",
max_memory={"cpu": ...}, offload_folder=...)`` puts on disk what the CPU budget cannot hold, as
Accelerate does; without a folder the model that does not fit is refused, the message saying how
to offload. Sizes in ``max_memory`` are read as Accelerate reads them.

Side by side with Accelerate where it is installed (the dev venv): the same call gives the same map.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from x_bigmodel import (
    dispatch_model,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from x_bigmodel.planning.device_map import plan_device_map

transformers = pytest.importorskip("transformers")

STRATEGIES = ["auto", "balanced", "sequential"]
LINEAR = 64 * 65 * 4  # bytes of one nn.Linear(64, 64) in float32


def llama_config():
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        pad_token_id=0,
    )


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(the reference model fully in memory, its safetensors folder, its size in bytes)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    folder = tmp_path_factory.mktemp("llama") / "ckpt"
    model.save_pretrained(folder, safe_serialization=True)
    return model, folder, sum(p.numel() * p.element_size() for p in model.parameters())


def empty_llama():
    with init_empty_weights():
        return transformers.LlamaForCausalLM(llama_config())


IDS = torch.tensor([[1, 5, 9, 200, 17, 3, 44, 80], [2, 2, 7, 100, 31, 250, 6, 9]])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_what_does_not_fit_the_cpu_budget_goes_to_the_offload_folder(llama, tmp_path, strategy) -> None:
    reference, folder, total = llama
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(
        empty_llama(), folder, device_map=strategy, max_memory={"cpu": total // 2}, offload_folder=offload
    )
    device_map = model.hf_device_map
    assert set(device_map.values()) == {"cpu", "disk"}, device_map
    assert device_map["model.embed_tokens"] == "cpu"  # filled in order: the head on the CPU ...
    assert device_map["model.layers.3"] == device_map["model.norm"] == device_map["lm_head"] == "disk"  # tail on disk
    values = list(device_map.values())
    assert values == sorted(values, key=["cpu", "disk"].index)  # never back from disk to the CPU
    assert model.lm_head.weight.device.type == "meta" and model.model.embed_tokens.weight.device.type == "cpu"
    # The folder holds the offload index of the disk weights (read in place from the checkpoint).
    assert sorted(p.name for p in offload.iterdir()) == ["index.json"]
    index = (offload / "index.json").read_text()
    assert '"lm_head.weight"' in index and '"model.layers.3.mlp.up_proj.weight"' in index
    assert '"model.embed_tokens.weight"' not in index
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, reference(IDS).logits)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fraction", [2, 3])
def test_the_device_map_is_accelerates(llama, tmp_path, strategy, fraction) -> None:
    accelerate = pytest.importorskip("accelerate")
    reference, folder, total = llama
    max_memory = {"cpu": total // fraction}
    theirs = empty_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = accelerate.load_checkpoint_and_dispatch(
            theirs,
            str(folder),
            device_map=strategy,
            max_memory=max_memory,
            no_split_module_classes=theirs._no_split_modules,
            offload_folder=str(tmp_path / "theirs"),
        )
    ours = load_checkpoint_and_dispatch(
        empty_llama(),
        folder,
        device_map=strategy,
        max_memory=max_memory,
        offload_folder=tmp_path / "ours",
        show_progress=False,
    )
    assert "disk" in ours.hf_device_map.values()
    assert ours.hf_device_map == dict(theirs.hf_device_map)
    with torch.no_grad():
        want = reference(IDS).logits
        assert torch.equal(ours(IDS).logits, want) and torch.equal(theirs(IDS).logits, want)


def test_without_an_offload_folder_the_model_is_refused_and_told_how(llama) -> None:
    _, folder, total = llama
    with pytest.raises(ValueError) as info:
        load_checkpoint_and_dispatch(empty_llama(), folder, device_map="auto", max_memory={"cpu": total // 2})
    message = str(info.value)
    assert "every device is full; the model needs" in message
    assert "; give a 'disk' budget in max_memory to offload the rest to disk" in message
    assert "offload_folder= to load_checkpoint_and_dispatch or dispatch_model" in message
    assert "puts the rest on disk in that folder" in message


def test_a_disk_budget_given_with_the_folder_is_kept(llama, tmp_path) -> None:
    _, folder, total = llama
    with pytest.raises(ValueError, match="every device is full"):
        load_checkpoint_and_dispatch(
            empty_llama(), folder, device_map="auto", max_memory={"cpu": total // 2, "disk": 1}, offload_folder=tmp_path
        )


def test_infer_auto_device_map_alone_uses_disk_only_with_a_budget() -> None:
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])
    with pytest.raises(ValueError, match="every device is full"):
        infer_auto_device_map(model, {"cpu": 3 * LINEAR})
    planned = plan_device_map(model, "auto", max_memory={"cpu": 3 * LINEAR}, offload_folder="unused")
    assert planned.as_dict() == {"0": "cpu", "1": "cpu", "2": "disk", "3": "disk", "4": "disk", "5": "disk"}
    assert planned.offload_folder == "unused"
    budgeted = infer_auto_device_map(model, {"cpu": 3 * LINEAR, "disk": "1GiB"})
    assert budgeted == planned.as_dict()


def sequential_model() -> nn.Sequential:
    torch.manual_seed(1)
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)]).eval()


def test_a_torch_checkpoint_tail_is_saved_in_the_offload_folder(tmp_path) -> None:
    reference = sequential_model()
    torch.save(reference.state_dict(), tmp_path / "model.bin")
    offload = tmp_path / "offload"
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])
    model = load_checkpoint_and_dispatch(
        model, tmp_path / "model.bin", device_map="auto", max_memory={"cpu": 3 * LINEAR}, offload_folder=offload
    )
    assert model.hf_device_map == {"0": "cpu", "1": "cpu", "2": "disk", "3": "disk", "4": "disk", "5": "disk"}
    files = sorted(p.name for p in offload.iterdir())
    assert "index.json" in files and any(name.endswith(".safetensors") for name in files), files
    x = torch.linspace(-1, 1, 128).reshape(2, 64)
    assert torch.equal(model(x), reference(x))


def test_dispatch_model_with_a_strategy_and_an_offload_dir_saves_the_tail(tmp_path, monkeypatch) -> None:
    reference = sequential_model()
    model = sequential_model()
    monkeypatch.setattr("x_bigmodel.planning.device_map.get_max_memory", lambda _: {"cpu": 3 * LINEAR})
    model = dispatch_model(model, "sequential", offload_dir=tmp_path / "offload")
    assert list(model.hf_device_map.values()) == ["cpu", "cpu", "disk", "disk", "disk", "disk"]
    assert any(p.suffix == ".safetensors" for p in (tmp_path / "offload").iterdir())
    assert model[5].weight.device.type == "meta"
    x = torch.linspace(-1, 1, 128).reshape(2, 64)
    assert torch.equal(model(x), reference(x))


# --- sizes, read as Accelerate reads them (x_common.sizes.parse_size) ---------------------------

SIZES = {10**9: "1GB", 10 * 10**9: "10GB", 10 * 2**30: "10GiB", 500 * 10**6: "500MB", 2**20: "1MiB", 1234: 1234}


@pytest.mark.parametrize(("expected", "size"), [(v, k) for v, k in SIZES.items()])
def test_max_memory_sizes(expected, size) -> None:
    assert get_max_memory({"cpu": size, "disk": size}) == {"cpu": expected, "disk": expected}
    model = nn.Sequential(nn.Linear(4, 4))
    assert get_balanced_memory(model, {"cpu": size}) == {"cpu": expected}


@pytest.mark.parametrize("size", ["1GB", "10GB", "10GiB", "1.5GB", "500MB", "2KiB", "3KB", 2048])
def test_max_memory_sizes_are_accelerates(size) -> None:
    modeling = pytest.importorskip("accelerate.utils.modeling")
    assert get_max_memory({"cpu": size}) == {"cpu": modeling.convert_file_size_to_int(size)}


# These spellings are read by x_common.sizes as Accelerate reads them ("1gb" counts bits, binary
# units in any case) or, beyond Accelerate, as SLURM does ("8G" is 8 GiB).
LENIENT = {"1gb": 10**9 // 8, "1Gb": 10**9 // 8, "10gib": 10 * 2**30, "8G": 8 * 2**30, "512M": 512 * 2**20}


@pytest.mark.parametrize(("size", "expected"), list(LENIENT.items()))
def test_accelerate_and_slurm_spellings_are_accepted(size, expected) -> None:
    assert get_max_memory({"cpu": size}) == {"cpu": expected}
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])
    assert infer_auto_device_map(model, {"cpu": size}) == {"": "cpu"}


@pytest.mark.parametrize("size", ["1gb", "1Gb", "10gib", "5mb", "7kb"])
def test_lowercase_spellings_are_accelerates(size) -> None:
    modeling = pytest.importorskip("accelerate.utils.modeling")
    assert get_max_memory({"cpu": size}) == {"cpu": modeling.convert_file_size_to_int(size)}


def test_a_size_string_budget_places_the_model(llama, tmp_path) -> None:
    _, folder, total = llama
    kib = f"{total // 2 // 1024}KiB"
    model = load_checkpoint_and_dispatch(
        empty_llama(), folder, device_map="auto", max_memory={"cpu": kib}, offload_folder=tmp_path, show_progress=False
    )
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}


def test_a_single_safetensors_file_with_balanced_puts_its_tail_on_disk(tmp_path: Path) -> None:
    # A single safetensors file as checkpoint, no folder: the same fallback.
    reference = sequential_model()
    save_file(reference.state_dict(), tmp_path / "model.safetensors")
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])
    model = load_checkpoint_and_dispatch(
        model,
        tmp_path / "model.safetensors",
        device_map="balanced",
        max_memory={"cpu": "50KiB"},
        offload_folder=tmp_path / "o",
    )
    assert model.hf_device_map == {"0": "cpu", "1": "cpu", "2": "disk", "3": "disk", "4": "disk", "5": "disk"}
    x = torch.linspace(-1, 1, 128).reshape(2, 64)
    assert torch.equal(model(x), reference(x))
    assert (tmp_path / "o" / "index.json").is_file()
