"""Reading checkpoint tensors in chunks through reused staging buffers (the path a load onto a GPU takes)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from x_bigmodel import load_checkpoint_and_dispatch
from x_bigmodel.files.device_staging import DeviceStaging
from x_bigmodel.files.safetensors_file import SafetensorsFile

TENSORS = {
    "empty": torch.empty(0),
    "scalar": torch.tensor(3.5),
    "odd": torch.arange(37, dtype=torch.float32),  # 148 bytes: chunks of 64 leave a 20-byte tail
    "bf16": torch.linspace(-1, 1, 50).to(torch.bfloat16),
    "int": torch.arange(12, dtype=torch.int64).view(3, 4),
}


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(TENSORS, str(path))
    return path


@pytest.mark.parametrize("chunk_bytes", [8, 64, 1 << 20])
@pytest.mark.parametrize("descriptor", ["open", "map_only"])
def test_staged_reads_give_every_byte_across_chunk_boundaries(checkpoint, chunk_bytes: int, descriptor: str) -> None:
    with SafetensorsFile(checkpoint) as file:
        if descriptor == "map_only":
            file.map_only()  # reads then copy from the map, the descriptor closed
        with DeviceStaging(chunk_bytes=chunk_bytes) as staging:
            for key, want in TENSORS.items():
                got = staging.read(file, key, torch.device("cpu"))
                assert got.dtype == want.dtype and got.shape == want.shape, key
                assert torch.equal(got, want), key


def test_a_range_outside_the_tensor_is_refused(checkpoint) -> None:
    with SafetensorsFile(checkpoint) as file, pytest.raises(ValueError, match=r"bytes 140\.\.156 lie outside 'odd'"):
        file.read_range("odd", 140, torch.empty(16, dtype=torch.uint8))


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(300, 257)  # rows that straddle the chunks below
        self.b = nn.Linear(257, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


@pytest.mark.requires_cuda(1)
@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_a_load_onto_the_gpu_through_small_chunks_equals_the_checkpoint(tmp_path, monkeypatch, dtype) -> None:
    import x_bigmodel.files.device_staging as staging_module

    monkeypatch.setattr(staging_module, "CHUNK_BYTES", 4096)  # many chunks per tensor, both buffers reused
    torch.manual_seed(0)
    source = _Model()
    save_file(source.state_dict(), str(tmp_path / "model.safetensors"))
    with torch.device("meta"):
        model = _Model()
    model = load_checkpoint_and_dispatch(model, str(tmp_path), device_map={"": 0}, dtype=dtype)
    for name, want in source.state_dict().items():
        got = model.state_dict()[name]
        assert got.device == torch.device("cuda", 0), name
        assert torch.equal(got.cpu(), want.to(dtype or want.dtype)), name
