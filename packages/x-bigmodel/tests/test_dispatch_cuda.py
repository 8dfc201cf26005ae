"""Dispatch with a GPU as the execution device: weights from RAM or disk copied in per forward
(on a side stream when prefetched), outputs on the GPU, equal to the model held on the GPU."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from x_bigmodel import (
    cpu_offload,
    cpu_offload_with_hook,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    remove_hook_from_module,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def make() -> nn.Sequential:
    return nn.Sequential(*[Block() for _ in range(6)])


@pytest.fixture
def reference() -> nn.Sequential:
    torch.manual_seed(0)
    return make().eval()


X = torch.linspace(-1, 1, 3 * 64).reshape(3, 64)


@pytest.mark.requires_cuda(1)
def test_cpu_offload_to_gpu_equals_the_model_on_gpu(reference) -> None:
    want = make().eval()
    want.load_state_dict(reference.state_dict())
    want = want.cuda()(X.cuda())
    model = cpu_offload(reference, execution_device=0)
    for _ in range(3):
        got = model(X)  # CPU input: moved to the GPU by the hooks
        assert got.device == torch.device("cuda", 0)
        assert torch.equal(got, want)
    assert all(p.device.type == "meta" for p in model.parameters())
    remove_hook_from_module(model, recurse=True)
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.requires_cuda(1)
@pytest.mark.parametrize("prefetch", [True, False])
def test_gpu_cpu_disk_map_equals_the_model_on_gpu(tmp_path, reference, prefetch) -> None:
    save_file(reference.state_dict(), str(tmp_path / "model.safetensors"))
    want = make().eval()
    want.load_state_dict(reference.state_dict())
    want = want.cuda()(X.cuda())
    with init_empty_weights():
        model = make().eval()
    device_map = {"0": 0, "1": 0, "2": "cpu", "3": "disk", "4": "cpu", "5": "disk"}
    model = load_checkpoint_and_dispatch(model, tmp_path, device_map=device_map, show_progress=False, prefetch=prefetch)
    assert model[0].up.weight.device == torch.device("cuda", 0)
    assert model[2].up.weight.device.type == "meta" and model[3].up.weight.device.type == "meta"
    for _ in range(3):
        assert torch.equal(model(X.cuda()), want)


@pytest.mark.requires_cuda(2)
def test_two_gpu_split_returns_outputs_on_the_first(reference) -> None:
    want = make().eval()
    want.load_state_dict(reference.state_dict())
    want = want.cuda()(X.cuda())
    model = dispatch_model(reference, {"0": 0, "1": 0, "2": 0, "3": 1, "4": 1, "5": 1})
    assert model[4].up.weight.device == torch.device("cuda", 1)
    got = model(X.cuda(0))
    assert got.device == torch.device("cuda", 0)
    torch.testing.assert_close(got, want)


@pytest.mark.requires_cuda(1)
def test_cpu_offload_with_hook_chain_on_the_gpu(reference) -> None:
    torch.manual_seed(1)
    second_reference = make().eval()
    want = second_reference(reference(X))
    first, hook_1 = cpu_offload_with_hook(reference)  # default: CUDA device 0
    second, hook_2 = cpu_offload_with_hook(second_reference, 0, prev_module_hook=hook_1)
    assert hook_1.hook.execution_device == torch.device("cuda", 0)
    assert next(first.parameters()).device.type == "cpu" and next(second.parameters()).device.type == "cpu"
    hidden = first(X)  # CPU input: the model and its input go to GPU 0
    assert hidden.device == torch.device("cuda", 0)
    assert all(p.device == torch.device("cuda", 0) for p in first.parameters())
    for _ in range(2):
        got = second(hidden)
        assert all(p.device.type == "cpu" for p in first.parameters())  # offloaded by second's forward
        assert all(p.device == torch.device("cuda", 0) for p in second.parameters())
    torch.testing.assert_close(got.cpu(), want)
    hook_2.offload()
    assert all(p.device.type == "cpu" for p in second.parameters())
    hook_1.remove()
    hook_2.remove()


@pytest.mark.requires_cuda(1)
@torch.no_grad()  # outputs that keep a graph would keep every block's weights alive
def test_prefetched_blocks_reuse_the_gpu_memory_of_the_ones_before() -> None:
    # The caching allocator reuses freed memory only on the stream that allocated it: the prefetch
    # copies on one side stream, so the GPU holds a few blocks' weights (the running one, the next,
    # the first one fetched on the default stream), not one per block. 16 MiB blocks: the allocator
    # gives each its own segment (blocks of 1-10 MiB share 20 MiB segments, one pool per stream, which
    # hides the count: 4 MiB blocks measured 40 MiB, two segments, on an H200).
    torch.manual_seed(0)
    width = 2048  # 16 MiB of weights per block, 12 blocks
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(12)]).eval()
    x = torch.randn(2, width, device="cuda")
    want = model.cuda()(x)
    model = cpu_offload(model.cpu(), execution_device=0, prefetch=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(0)
    for _ in range(3):
        got = model(x)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    block = width * width * 4
    assert torch.cuda.memory_reserved(0) - before <= 6 * block, torch.cuda.memory_summary(0, abbreviated=True)
