"""x_bigmodel.from_pretrained on a model whose class is custom code in its folder (config.auto_map).

The folder holds its own configuration and modeling files, as a Hub repo with custom code does. With
trust_remote_code=True the class in config.architectures is loaded from them (transformers'
dynamic-module machinery) and must give transformers' own outputs; without it the load is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from x_bigmodel import from_pretrained

transformers = pytest.importorskip("transformers")

CONFIGURATION = """
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "x-tiny-custom"

    def __init__(self, hidden=16, vocab=32, layers=3, **kwargs):
        self.hidden, self.vocab, self.layers = hidden, vocab, layers
        super().__init__(**kwargs)
"""

MODELING = """
import torch
from torch import nn
from transformers import PreTrainedModel

from .configuration_tiny import TinyConfig


class TinyBlock(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class TinyModel(PreTrainedModel):
    config_class = TinyConfig
    base_model_prefix = "tiny"
    _no_split_modules = ["TinyBlock"]

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.blocks = nn.ModuleList(TinyBlock(config.hidden) for _ in range(config.layers))
        self.post_init()

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return x
"""


@pytest.fixture
def custom(tmp_path) -> Path:
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "configuration_tiny.py").write_text(CONFIGURATION)
    (folder / "modeling_tiny.py").write_text(MODELING)
    config = {
        "model_type": "x-tiny-custom",
        "architectures": ["TinyModel"],
        "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"},
        "hidden": 16,
        "vocab": 32,
        "layers": 3,
    }
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(5)
    shapes = {"embed.weight": (32, 16)}
    for i in range(3):
        shapes |= {f"blocks.{i}.up.weight": (32, 16), f"blocks.{i}.up.bias": (32,)}
        shapes |= {f"blocks.{i}.down.weight": (16, 32), f"blocks.{i}.down.bias": (16,)}
    state = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_custom_code_class_loads_with_trust_remote_code(custom, tmp_path) -> None:
    ids = torch.tensor([[1, 4, 9, 30, 2]])
    reference = transformers.AutoModel.from_pretrained(custom, trust_remote_code=True).eval()
    with torch.no_grad():
        want = reference(ids)
    for kwargs in ({}, {"max_memory": {"cpu": 9_000}, "offload_folder": tmp_path / "off"}):
        model = from_pretrained(custom, trust_remote_code=True, **kwargs)
        assert type(model).__name__ == "TinyModel" and not model.training
        with torch.no_grad():
            assert torch.equal(model(ids), want)
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}, model.hf_device_map


def test_custom_code_is_refused_without_trust_remote_code(custom) -> None:
    with pytest.raises(ValueError, match="trust_remote_code"):
        from_pretrained(custom)
