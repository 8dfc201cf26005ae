"""dispatch_model and friends on plain PyTorch models: exact outputs, weights off between forwards,
nothing copied for safetensors checkpoints, the offload folder formats, and clear errors."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from x_bigmodel import (
    ModelHook,
    add_hook_to_module,
    cpu_offload,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    remove_hook_from_module,
)
from x_bigmodel.devices.device_moves import send_to_device


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    """Embedding, blocks and a head tied to the embedding, plus a parameter and a buffer of its own."""

    def __init__(self, blocks: int = 4, width: int = 16, vocab: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.scale = nn.Parameter(torch.ones(width))
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("offset", torch.zeros(width))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * self.scale + self.offset
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture
def reference() -> Net:
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.offset.normal_()
    return net


@pytest.fixture
def checkpoint(tmp_path, reference):
    state = {k: v for k, v in reference.state_dict().items() if k != "head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    return tmp_path / "model.safetensors"


IDS = torch.tensor([[1, 7, 3, 9], [4, 4, 0, 49]])


def empty_net() -> Net:
    with init_empty_weights():
        return Net().eval()


MIXED = {
    "embed": "cpu",
    "scale": "cpu",
    "blocks.0": "disk",
    "blocks.1": "cpu",
    "blocks.2": "disk",
    "blocks.3": "disk",
    "head": "cpu",
    "offset": "cpu",
}


@pytest.mark.parametrize(
    "device_map",
    [{"": "disk"}, MIXED, {**MIXED, "embed": "disk", "head": "disk"}, {"": "cpu"}],
    ids=["all-disk", "mixed", "tied-on-disk", "all-cpu"],
)
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "no-prefetch"])
def test_outputs_equal_the_model_in_memory(tmp_path, reference, checkpoint, device_map, prefetch) -> None:
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(
        empty_net(), checkpoint, device_map=device_map, offload_folder=offload, show_progress=False, prefetch=prefetch
    )
    want = reference(IDS)
    for _ in range(3):  # the second and later forwards follow the learned order
        assert torch.equal(model(IDS), want)
    disk_weights = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    expected_on_disk = {k for k, v in model.hf_device_map.items() if v == "disk"}
    assert all(any(n == k or n.startswith(k + ".") or k == "" for k in expected_on_disk) for n in disk_weights)
    assert bool(disk_weights) == bool(expected_on_disk)
    # The checkpoint is safetensors: disk weights are read in place; at most an index is written.
    assert {p.name for p in offload.glob("*")} <= {"index.json"}
    assert model.hf_device_map == device_map


def test_dtype_applies_to_disk_weights_read_and_converted_per_forward(checkpoint, reference) -> None:
    model = load_checkpoint_and_dispatch(
        empty_net(), checkpoint, device_map=MIXED, dtype=torch.bfloat16, show_progress=False
    )
    want = _copy(reference).to(torch.bfloat16)(IDS)
    got = model(IDS)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert model.blocks[0].up.weight.dtype == torch.bfloat16 and model.blocks[0].up.weight.device.type == "meta"


def test_auto_map_with_a_cpu_budget_puts_blocks_on_disk(checkpoint, reference) -> None:
    model = load_checkpoint_and_dispatch(
        empty_net(),
        checkpoint,
        device_map="auto",
        max_memory={"cpu": 12_000, "disk": "1GiB"},
        no_split_module_classes=["Block"],
        show_progress=False,
    )
    devices = set(model.hf_device_map.values())
    assert devices == {"cpu", "disk"}, model.hf_device_map
    assert torch.equal(model(IDS), reference(IDS))
    on_disk = [k for k, v in model.hf_device_map.items() if v == "disk"]
    assert model.get_submodule(on_disk[0]).state_dict(keep_vars=True).popitem()[1].device.type == "meta"


def test_blocks_are_brought_in_one_at_a_time_and_released_after(checkpoint) -> None:
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map={"": "disk"}, show_progress=False)
    seen = []

    class Spy(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            seen.append(sum(p.device.type != "meta" for p in model.parameters()))
            return args, kwargs

    # Appended after the dispatch hook, so it sees the block with its weights in.
    add_hook_to_module(model.blocks[2].up, Spy(), append=True)
    model(IDS)
    # Within blocks.2.up only its own two tensors are real, and the root's own `scale` (the root
    # holds it for its whole forward); the tied embedding and every other block are out.
    assert seen == [3]
    assert all(p.device.type == "meta" for p in model.parameters())


def test_prefetch_runs_on_a_background_thread(checkpoint) -> None:
    def prefetchers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("x-bigmodel-prefetch")}

    before = prefetchers()
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map={"": "disk"}, show_progress=False)
    model(IDS)
    started = prefetchers() - before
    assert len(started) == 1
    remove_hook_from_module(model, recurse=True)  # shuts the prefetcher down
    assert not started & prefetchers()


def test_weights_are_released_when_the_forward_raises(checkpoint) -> None:
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map=MIXED, show_progress=False)
    with pytest.raises(IndexError):
        model(torch.tensor([[1000]]))  # out of the embedding's range: the embedding raises
    with pytest.raises(RuntimeError):
        model.blocks[2](torch.ones(3, 5))  # wrong width: the block raises after its weights came in
    assert all(p.device.type == "meta" for p in model.blocks[2].parameters())
    # No no-split classes were given: each leaf of the block is a unit with its own hook.
    assert model.blocks[2].up._hf_hook.block.depth == 0 and not hasattr(model.blocks[2], "_hf_hook")


def test_torch_checkpoint_needs_an_offload_folder_for_disk_weights(tmp_path, reference) -> None:
    state = {k: v for k, v in reference.state_dict().items() if k != "head.weight"}
    torch.save(state, tmp_path / "model.bin")
    with pytest.raises(ValueError, match=r"comes from a torch file.*pass offload_folder="):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "model.bin", device_map=MIXED, show_progress=False)
    model = load_checkpoint_and_dispatch(
        empty_net(), tmp_path / "model.bin", device_map=MIXED, offload_folder=tmp_path / "off", show_progress=False
    )
    assert torch.equal(model(IDS), reference(IDS))
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert {"blocks.0.up.weight", "blocks.3.down.bias"} <= set(index)
    assert all(e["safetensors_file"].startswith(str(tmp_path / "off")) for e in index.values())


def test_disk_offload_saves_once_then_reuses_the_folder(tmp_path, reference) -> None:
    want = reference(IDS)
    model = disk_offload(_copy(reference), tmp_path / "off", execution_device="cpu")
    assert torch.equal(model(IDS), want)
    assert all(p.device.type == "meta" for p in model.parameters())
    # One file per unit (each leaf here), written once.
    files = sorted(p.name for p in (tmp_path / "off").iterdir())
    assert files[:3] == ["blocks.0.down.safetensors", "blocks.0.up.safetensors", "blocks.1.down.safetensors"]
    # The tied head is saved with the embedding; the root's own parameter and buffer on their own.
    assert {"index.json", "embed.safetensors", "scale.safetensors", "offset.safetensors"} <= set(files)
    assert len(files) == 12
    stamp = (tmp_path / "off" / "blocks.2.up.safetensors").stat().st_mtime_ns
    # A folder with an index is taken as holding the weights: nothing is written again.
    again = disk_offload(empty_net(), tmp_path / "off", execution_device="cpu")
    assert torch.equal(again(IDS), want)
    assert (tmp_path / "off" / "blocks.2.up.safetensors").stat().st_mtime_ns == stamp


def test_accelerate_raw_offload_folder_is_read(tmp_path, reference) -> None:
    # Accelerate's layout: <name>.dat raw bytes + index.json {name: {dtype, shape}}.
    folder = tmp_path / "acc"
    folder.mkdir()
    index = {}
    for name, value in reference.state_dict().items():
        array = value.numpy()
        np.memmap(folder / f"{name}.dat", dtype=array.dtype, mode="w+", shape=array.shape)[...] = array
        index[name] = {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    (folder / "index.json").write_text(json.dumps(index))
    model = disk_offload(empty_net(), folder, execution_device="cpu")
    assert torch.equal(model(IDS), reference(IDS))


def test_truncated_raw_offload_file_is_named(tmp_path, reference) -> None:
    folder = tmp_path / "acc"
    folder.mkdir()
    index = {}
    for name, value in reference.state_dict().items():
        (folder / f"{name}.dat").write_bytes(value.numpy().tobytes()[: 8 if name == "blocks.1.up.weight" else None])
        index[name] = {"dtype": "float32", "shape": list(value.shape)}
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"blocks\.1\.up\.weight\.dat' holds 8 bytes .* needs 2048"):
        disk_offload(empty_net(), folder, execution_device="cpu")


def test_offloaded_tensor_without_a_value_is_named(checkpoint) -> None:
    with pytest.raises(ValueError, match=r"^scale is offloaded but has no value: it is on the meta device"):
        dispatch_model(empty_net(), {"": "disk"})


def test_cpu_offload_on_cpu_and_hook_removal(reference) -> None:
    model = cpu_offload(_copy(reference), execution_device="cpu")
    # The CPU runs everything: nothing is offloaded, so only the root is hooked (inputs to the CPU).
    assert [n for n, m in model.named_modules() if hasattr(m, "_hf_hook")] == [""]
    assert torch.equal(model(IDS), reference(IDS))
    remove_hook_from_module(model, recurse=True)
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())
    assert torch.equal(model(IDS), reference(IDS))


def test_single_device_map_moves_the_model_without_hooks(reference) -> None:
    model = dispatch_model(_copy(reference), {"": "cpu"})
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())
    assert model.hf_device_map == {"": "cpu"}


def test_send_to_device_moves_only_tensors_and_keeps_untouched_objects() -> None:
    cache = object()
    batch = {"ids": torch.ones(2), "cache": cache, "nested": [torch.zeros(1), (torch.zeros(1), "x")]}
    moved = send_to_device(batch, torch.device("meta"), skip_keys=("cache",))
    assert moved["ids"].device.type == "meta" and moved["cache"] is cache
    assert moved["nested"][1][0].device.type == "meta" and moved["nested"][1][1] == "x"
    same = {"ids": torch.ones(2)}
    assert send_to_device(same, torch.device("cpu")) is same


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_forward_with_disk_offload_holds_about_one_block_in_memory(tmp_path) -> None:
    # 8 blocks of 16 MiB on disk: a forward that kept what it brought in would grow by 128 MiB.
    script = textwrap.dedent(
        f"""
        import torch
        from torch import nn
        from safetensors.torch import save_file
        from x_bigmodel import init_empty_weights, load_checkpoint_and_dispatch

        def make():
            return nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(8)])
        save_file(make().state_dict(), "{tmp_path}/model.safetensors")
        with init_empty_weights():
            model = make()
        model = load_checkpoint_and_dispatch(model, "{tmp_path}", device_map={{"": "disk"}}, show_progress=False)
        x = torch.ones(1, 2048)
        with torch.no_grad():
            model(x)  # warm up allocator and threads
            def rss():
                for line in open("/proc/self/status"):
                    if line.startswith("VmHWM"):
                        return int(line.split()[1]) * 1024
            open("/proc/self/clear_refs", "w").write("5")
            base = rss()
            model(x)
            model(x)
        print((rss() - base) / 2**20)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    grown = float(done.stdout.strip())
    # The running block and the prefetched next one: 32 MiB, plus allocator slack.
    assert grown < 48, f"peak RSS grew by {grown:.1f} MiB during offloaded forwards"


def _copy(net: Net) -> Net:
    fresh = Net().eval()
    fresh.load_state_dict(net.state_dict())
    with torch.no_grad():
        fresh.offset.copy_(net.offset)
    return fresh


# --- regressions found in review ------------------------------------------------------------


def test_a_module_list_entry_on_disk_runs(checkpoint, reference) -> None:
    # "blocks" is a ModuleList: never called itself, so its units must carry the hooks.
    device_map = {"embed": "cpu", "scale": "cpu", "blocks": "disk", "head": "cpu", "offset": "cpu"}
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map=device_map, show_progress=False)
    assert torch.equal(model(IDS), reference(IDS))
    assert all(p.device.type == "meta" for p in model.blocks.parameters())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_after_a_forward_runs_its_own_prefetch(checkpoint, reference) -> None:
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map={"": "disk"}, show_progress=False)
    want = reference(IDS)
    model(IDS)  # starts the parent's prefetch thread, which the child will not have
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        signal.alarm(30)
        # GNU OpenMP's thread pool does not survive fork: a child whose parent ran a parallel
        # region hangs in its first one (torch's linear here), whatever x does. One thread keeps
        # the child out of OpenMP, as torch's own DataLoader workers do.
        torch.set_num_threads(1)
        os._exit(0 if torch.equal(model(IDS), want) else 3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_keyboard_interrupt_leaves_nothing_in_after_the_next_forward(checkpoint, reference) -> None:
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map={"": "disk"}, show_progress=False)

    def interrupt(module, args):
        raise KeyboardInterrupt  # skips PyTorch's always_call hooks: post-forward never runs

    handle = model.blocks[1].up.register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        model(IDS)
    handle.remove()
    assert torch.equal(model(IDS), reference(IDS))
    assert model.blocks[1].up._hf_hook.block.depth == 0
    assert all(p.device.type == "meta" for p in model.parameters())


class UsesChild(nn.Module):
    """Uses its child's weight without calling the child: must be brought in whole."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(nn.functional.linear(x, self.inner.weight, self.inner.bias))


@pytest.mark.parametrize("root", [True, False], ids=["root", "inside"])
def test_preload_module_classes_bring_their_subtree_in_whole(tmp_path, root) -> None:
    torch.manual_seed(0)
    reference = UsesChild() if root else nn.Sequential(UsesChild(), nn.Linear(8, 8))
    model = copy.deepcopy(reference)
    x = torch.ones(2, 8)
    model = disk_offload(model, tmp_path / "off", execution_device="cpu", preload_module_classes=["UsesChild"])
    assert torch.equal(model(x), reference(x))


def test_a_module_registered_under_two_names_is_offloaded(tmp_path) -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = self.a

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    torch.manual_seed(0)
    reference = Shared()
    x = torch.ones(1, 4)
    assert torch.equal(
        disk_offload(copy.deepcopy(reference), tmp_path / "off", execution_device="cpu")(x), reference(x)
    )


def test_removing_disk_offload_hooks_reads_the_weights_back(tmp_path, reference) -> None:
    model = disk_offload(_copy(reference), tmp_path / "off", execution_device="cpu")
    remove_hook_from_module(model, recurse=True)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert torch.equal(model(IDS), reference(IDS))
