"""What a forward over disk-offloaded weights holds in memory, read from /proc/self/smaps: the
checkpoint's pages mapped in at any time stay within one block plus its largest weight (the next
block comes in as the current one hands its weights back), the pages go back on the release
thread, not the forward's, and a prefetch still waiting for room never holds up an exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from x_bigmodel import init_empty_weights, load_checkpoint_and_dispatch
from x_bigmodel.files.safetensors_file import SafetensorsFile

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads /proc/self/smaps (Linux)")

WIDTH = 1024  # a 4 MiB weight; a block holds four: 16 MiB
MIB = 2**20


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.d(torch.tanh(self.c(self.b(self.a(x)))))


def make(blocks: int = 6) -> nn.Module:
    return nn.Sequential(*[Block() for _ in range(blocks)])


@pytest.fixture
def offloaded(tmp_path):
    torch.manual_seed(0)
    reference = make().eval()
    path = (tmp_path / "model.safetensors").resolve()
    save_file(reference.state_dict(), str(path))
    with init_empty_weights():
        model = make()
    model = load_checkpoint_and_dispatch(
        model, str(tmp_path), device_map={"": "disk"}, no_split_module_classes=["Block"], show_progress=False
    )
    return reference, model, path


def test_a_forward_maps_in_one_block_plus_its_largest_weight(offloaded, mapped_bytes) -> None:
    reference, model, path = offloaded
    assert model._hf_hook.prefetcher.pages.limit == 20 * MIB  # 16 MiB block + 4 MiB weight
    seen: list[int] = []

    def look(*_: object) -> None:
        seen.append(mapped_bytes(path))

    for module in model.modules():  # before and after each forward, ahead of the hooks that hand pages back
        module.register_forward_pre_hook(look, prepend=True)
        module.register_forward_hook(look, prepend=True)
    x = torch.randn(256, WIDTH, generator=torch.Generator().manual_seed(1))  # each block computes a while
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(x), reference(x))
    assert len(seen) == 3 * 2 * (1 + 6 * 5)
    # A block's four weights are all in when its last Linear runs: the measure sees them.
    assert max(seen) >= 16 * MIB
    # Two whole blocks (32 MiB) would be in without the bound: the next one prefetched meanwhile.
    # Over 20 MiB: pages a tensor shares with its neighbours, and the kernel's fault-around (it
    # maps up to 64 KiB of cached pages beside each one faulted in).
    assert max(seen) <= 21 * MIB, [s // 1024 for s in seen]


def test_pages_go_back_on_the_release_thread(offloaded, monkeypatch) -> None:
    reference, model, _ = offloaded
    threads: list[str] = []
    release = SafetensorsFile.release

    def recorded(self: SafetensorsFile, ranges: list[tuple[int, int]]) -> None:
        threads.append(threading.current_thread().name)
        release(self, ranges)

    monkeypatch.setattr(SafetensorsFile, "release", recorded)
    x = torch.randn(4, WIDTH)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(x), reference(x))
    model._hf_hook.prefetcher._released.result()  # the hand-backs run in order: all are done
    # Each weight as its Linear ends, then the whole block at its end: 6 blocks x (4 + 4), twice.
    assert len(threads) == 2 * 6 * 8
    assert set(threads) == {"x-bigmodel-release"}


class Twice(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(self.a(self.a(x)) + self.b(x) + self.c(x))  # ``a`` runs again after handing back


def test_a_weight_used_again_after_it_went_back_is_read_again(tmp_path, mapped_bytes) -> None:
    torch.manual_seed(0)
    reference = nn.Sequential(*[Twice() for _ in range(3)]).eval()
    path = (tmp_path / "model.safetensors").resolve()
    save_file(reference.state_dict(), str(path))
    with init_empty_weights():
        model = nn.Sequential(*[Twice() for _ in range(3)])
    model = load_checkpoint_and_dispatch(
        model, str(tmp_path), device_map={"": "disk"}, no_split_module_classes=["Twice"], show_progress=False
    )
    x = torch.randn(8, WIDTH)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(x), reference(x))
    model._hf_hook.prefetcher._released.result()
    # All went back at each block's end, the pages read again too: what is left is the first
    # block, prefetched for the next forward.
    assert mapped_bytes(path) <= 16 * MIB + 1 * MIB


def test_leaf_units_keep_two_blocks_in(tmp_path) -> None:
    # Blocks that hand nothing back early (a Linear each): the next is prefetched whole, as before.
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4)])
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    model = load_checkpoint_and_dispatch(model, str(tmp_path), device_map={"": "disk"}, show_progress=False)
    assert model._hf_hook.prefetcher.pages.limit == 8 * MIB


def test_exits_while_a_prefetch_waits_for_room(tmp_path) -> None:
    # A KeyboardInterrupt skips the hooks that hand block 0's pages back: the prefetch of block 1
    # then waits for room that never comes, and the interpreter must still exit.
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from safetensors.torch import save_file
        from test_offload_memory import make
        from x_bigmodel import init_empty_weights, load_checkpoint_and_dispatch

        save_file(make().state_dict(), "{tmp_path}/model.safetensors")
        with init_empty_weights():
            model = make()
        model = load_checkpoint_and_dispatch(
            model, "{tmp_path}", device_map={{"": "disk"}}, no_split_module_classes=["Block"], show_progress=False
        )
        def stop(*args):
            raise KeyboardInterrupt
        model[0].c.register_forward_pre_hook(stop)
        try:
            with torch.no_grad():
                model(torch.ones(1, 1024))
        except KeyboardInterrupt:
            print("interrupted")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted"
