"""The read-ahead ``from_pretrained`` starts for mapped CPU weights: which bytes it asks the kernel
for (exactly the CPU-placed tensors, in the model's order, never the disk-offloaded ones), that it
maps nothing into the process, and that its thread ends: when done, when the model is freed, at exit.
"""

from __future__ import annotations

import gc
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from x_bigmodel import from_pretrained
from x_bigmodel.loading.readahead import ByteRange, merge_ranges, start_readahead

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise (Linux)")

PROMPT = torch.tensor([[1, 17, 42, 7, 99, 23]])
THREAD = "x-bigmodel-readahead"


def join_readaheads() -> None:
    for thread in threading.enumerate():
        if thread.name == THREAD:
            thread.join(60)
            assert not thread.is_alive()


def tensor_ranges(folder: Path) -> dict[str, tuple[Path, int, int]]:
    """Every checkpoint tensor's (file, first byte, end) in the files, from their headers."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
        for key, entry in header.items():
            if key != "__metadata__":
                begin, end = entry["data_offsets"]
                out[key] = (path.resolve(), 8 + size + begin, 8 + size + end)
    return out


@pytest.fixture
def recorded(monkeypatch):
    """The ``posix_fadvise`` calls made from now on: (file, offset, length, advice), still applied."""
    calls: list[tuple[Path, int, int, int]] = []
    real = os.posix_fadvise

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((Path(os.readlink(f"/proc/self/fd/{fd}")), offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", advise)
    return calls


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tiny_llama):
    config = tiny_llama
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama") / "ckpt"
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="40KB")
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        want = reference.generate(PROMPT, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    return folder, want


@pytest.mark.parametrize("budget", [None, 600_000])
def test_reads_ahead_exactly_the_cpu_weights_in_model_order(llama, tmp_path, recorded, budget) -> None:
    folder, want = llama
    kwargs = {} if budget is None else {"max_memory": {"cpu": budget}, "offload_folder": tmp_path / "off"}
    model = from_pretrained(folder, show_progress=False, **kwargs)
    join_readaheads()
    ranges = tensor_ranges(folder)
    order = list(dict(model.named_parameters()))
    on_cpu = {n for n in ranges if model.get_parameter(n).device.type == "cpu"}
    on_disk = {n for n in ranges if model.get_parameter(n).device.type == "meta"}  # offloaded between forwards
    assert on_cpu | on_disk == set(ranges) and on_cpu
    assert bool(on_disk) == (budget is not None), model.hf_device_map
    # The embedding table is read row by row as ids are looked up (its first use faults them in).
    assert "model.embed_tokens.weight" in on_cpu
    on_cpu.remove("model.embed_tokens.weight")
    calls = [
        (path, offset, offset + length) for path, offset, length, advice in recorded if path.parent == folder.resolve()
    ]
    assert calls and all(advice == os.POSIX_FADV_WILLNEED for *_, advice in recorded)

    covered: list[str] = []  # the tensors each call reads, call after call
    for path, begin, end in calls:
        inside = sorted(
            (n for n, (p, b, e) in ranges.items() if p == path and b < end and begin < e), key=lambda n: ranges[n][1]
        )
        assert inside and set(inside) <= on_cpu, f"{path.name} [{begin}, {end}) reads {set(inside) - on_cpu}"
        assert ranges[inside[0]][1] <= begin and end <= ranges[inside[-1]][2]  # no byte outside them
        covered += inside
    for name in on_cpu:  # every CPU tensor, each byte of it
        path, begin, end = ranges[name]
        assert sum(min(e, end) - max(b, begin) for p, b, e in calls if p == path and b < end and begin < e) == (
            end - begin
        ), name
    positions = [order.index(n) for n in dict.fromkeys(covered)]
    assert positions == sorted(positions)  # as a forward uses them, whatever the files' order

    with torch.no_grad():
        got = model.generate(PROMPT, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)


def test_an_embedding_tied_to_the_head_is_read_ahead(tmp_path, recorded) -> None:
    config = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    model = from_pretrained(tmp_path, show_progress=False)
    join_readaheads()
    assert model.lm_head.weight is model.transformer.wte.weight
    ranges = tensor_ranges(tmp_path)
    read = [(offset, offset + length) for path, offset, length, _ in recorded if path.parent == tmp_path.resolve()]

    def was_read(name: str) -> bool:
        _, begin, end = ranges[name]
        return any(b <= begin and end <= e for b, e in read)

    assert was_read("transformer.wte.weight")  # the head reads every row of it
    assert not was_read("transformer.wpe.weight")  # looked up by position only
    assert was_read("transformer.h.1.mlp.c_proj.weight")


def test_an_all_disk_model_reads_nothing_ahead(llama, tmp_path, recorded) -> None:
    folder, want = llama
    model = from_pretrained(folder, max_memory={"cpu": 1}, offload_folder=tmp_path / "off", show_progress=False)
    join_readaheads()
    assert set(model.hf_device_map.values()) == {"disk"}
    assert [call for call in recorded if call[0].parent == folder.resolve()] == []
    with torch.no_grad():
        assert torch.equal(model.generate(PROMPT, max_new_tokens=8, min_new_tokens=8, do_sample=False), want)


def test_reading_ahead_maps_nothing_into_the_process(tmp_path, wide_vocab_llama, mapped_bytes) -> None:
    config = wide_vocab_llama
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)  # one 17 MB file
    path = (tmp_path / "model.safetensors").resolve()
    model = from_pretrained(tmp_path, show_progress=False)
    join_readaheads()
    assert mapped_bytes(path) < 2**20  # in the page cache, maybe; not in RSS
    del model


def test_merge_joins_ranges_that_follow_on_in_the_same_file() -> None:
    a, b = Path("a"), Path("b")
    got = merge_ranges(
        [ByteRange(a, 0, 10), ByteRange(a, 10, 5), ByteRange(a, 20, 5), ByteRange(b, 25, 1), ByteRange(a, 0, 0)]
    )
    assert got == [ByteRange(a, 0, 25), ByteRange(b, 25, 1)]  # a 5-byte gap is padding, kept
    assert merge_ranges([ByteRange(a, 100, 10), ByteRange(a, 0, 10)]) == [ByteRange(a, 100, 10), ByteRange(a, 0, 10)]
    assert merge_ranges([ByteRange(a, 0, 10), ByteRange(a, 10 + 8192, 1)]) == [
        ByteRange(a, 0, 10),
        ByteRange(a, 10 + 8192, 1),
    ]


def test_stops_after_the_chunk_in_progress_once_the_owner_is_freed(tmp_path, monkeypatch) -> None:
    path = tmp_path / "weights"
    path.write_bytes(bytes(4 * 4096))
    calls, entered, go = [], threading.Event(), threading.Event()

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length))
        entered.set()
        go.wait(60)

    monkeypatch.setattr(os, "posix_fadvise", advise)

    class Owner:
        pass

    owner = Owner()
    ahead = start_readahead([ByteRange(path, 0, 4 * 4096)], owner=owner, chunk=4096)
    assert ahead is not None and entered.wait(60)
    del owner
    gc.collect()
    go.set()
    assert ahead.join(60)
    assert calls == [(0, 4096)]


def test_a_vanished_file_ends_the_thread_quietly(tmp_path, monkeypatch) -> None:
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    ahead = start_readahead([ByteRange(tmp_path / "gone", 0, 4096)])
    assert ahead is not None and ahead.join(60)
    assert failures == []
    assert start_readahead([]) is None


def test_the_interpreter_exits_with_a_read_ahead_still_running(tmp_path) -> None:
    (tmp_path / "weights").write_bytes(bytes(4096))
    script = textwrap.dedent(
        f"""
        import os, threading, time
        from pathlib import Path
        from x_bigmodel.loading.readahead import ByteRange, start_readahead

        started = threading.Event()
        def advise(*args):
            started.set()
            time.sleep(3600)  # a read-ahead stuck on a slow disk
        os.posix_fadvise = advise
        start_readahead([ByteRange(Path({str(tmp_path / "weights")!r}), 0, 4096)])
        assert started.wait(60)
        print("exiting")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
