"""One variant of bench_bigmodel.py in a fresh process: load a checkpoint, run forwards, print one JSON line.

    python worker.py '{"library": "x", "scenario": "cpu", "cache": "cold", "checkpoint": DIR, ...}'

library: "reference" (read every byte of the shards once: `readinto` into a reused 16 MiB buffer),
"plain" (PyTorch by hand: the model built on the meta device, every shard read with
`safetensors.torch.load_file`, then one `load_state_dict(..., assign=True)`), "accelerate" or "x"
(`init_empty_weights` + `load_checkpoint_and_dispatch`). scenario: "cpu" (`device_map={"": "cpu"}`),
"gpu" (`device_map={"": 0}`; plain: `load_file(..., device="cuda:0")`; reference: every byte read
into a pinned buffer and copied to GPU 0; loads and forwards end with `torch.cuda.synchronize`)
or "disk" (`device_map="sequential"`, max_memory {"cpu": CPU_BUDGET, "disk": "100GiB"}, no split of
LlamaDecoderLayer, the empty OFFLOAD folder). cache: "warm" (every shard read once, untimed, just
before) or "cold" (`os.sync()`, then `posix_fadvise(DONTNEED)` on every shard just before).

Order: imports, config, the empty model, the cache state; then the baseline (VmRSS; VmHWM reset
through /proc/self/clear_refs; write_bytes of /proc/self/io), the timed load, the peak over it
(VmHWM) and the bytes written; VmHWM reset, the first forward (1 x SEQ seeded token ids, under
inference_mode) timed with its own peak; then FORWARDS - 1 more forwards. Peaks are reported
above the baseline, so they count what loading and running add, not the interpreter and imports.
The logits' float64 sum and last-token head let bench_bigmodel.py check that all variants agree.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

ARGS = json.loads(sys.argv[1])
THREADS = int(ARGS.get("threads") or os.cpu_count() or 1)
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(THREADS)  # before torch is imported

import torch  # noqa: E402

BUFFER = 16 << 20


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current VmRSS


def written_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))


def shard_files(folder: Path) -> list[Path]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return [folder / name for name in sorted(set(index["weight_map"].values()))]


def read_all(files: list[Path]) -> int:
    buffer = bytearray(BUFFER)
    view = memoryview(buffer)
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return total


def read_to_gpu(files: list[Path], pinned: torch.Tensor, target: torch.Tensor) -> int:
    """Every byte of ``files`` read into ``pinned`` and copied to GPU 0's ``target``, a chunk at a time."""
    view = memoryview(pinned.numpy())
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                target[:n].copy_(pinned[:n])
                total += n
    torch.cuda.synchronize()
    return total


def evict(files: list[Path]) -> None:
    os.sync()  # dirty pages cannot be dropped
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def folder_bytes(folder: str | None) -> int:
    if not folder or not os.path.isdir(folder):
        return 0
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def cpu_param_bytes(model: torch.nn.Module) -> int:
    """Parameter and buffer bytes the device map puts on the CPU (all of them, without a map)."""
    device_map = getattr(model, "hf_device_map", None)
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if not device_map:
        return tensor_bytes(t for t in named.values() if t.device.type == "cpu")

    def placed(name: str) -> str:
        while name not in device_map:
            name = name.rpartition(".")[0] if "." in name else ""
            if name == "" and "" not in device_map:
                return "?"
        return str(device_map[name])

    return tensor_bytes(t for name, t in named.items() if placed(name) == "cpu")


def build_empty(library: str, config):
    from transformers import LlamaForCausalLM

    if library == "plain":
        with torch.device("meta"):
            return LlamaForCausalLM(config)
    if library == "accelerate":
        from accelerate import init_empty_weights
    else:
        from x_bigmodel import init_empty_weights
    with init_empty_weights():
        return LlamaForCausalLM(config)


def load(library: str, model, files: list[Path]):
    """The timed call; returns the model to run."""
    if library == "plain":
        from safetensors.torch import load_file
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        device = "cuda:0" if ARGS["scenario"] == "gpu" else "cpu"
        state = {}
        for path in files:
            state.update(load_file(path, device=device))
        model.load_state_dict(state, assign=True)
        del state
        # inv_freq is a non-persistent buffer: not in the checkpoint, so rebuilt off the meta device.
        model.model.rotary_emb = LlamaRotaryEmbedding(model.config).to(device)
        return model
    if library == "accelerate":
        from accelerate import load_checkpoint_and_dispatch
    else:
        from x_bigmodel import load_checkpoint_and_dispatch
    if ARGS["scenario"] in ("cpu", "gpu"):
        options = {"device_map": {"": "cpu" if ARGS["scenario"] == "cpu" else 0}}
    else:
        options = {
            # "sequential", not "auto": Accelerate's "auto" fails with a "disk" key in max_memory (its
            # get_balanced_memory calls torch.device("disk")). Without GPUs both infer the same map.
            "device_map": "sequential",
            "max_memory": {"cpu": ARGS["cpu_budget"], "disk": "100GiB"},
            "no_split_module_classes": ["LlamaDecoderLayer"],
            "offload_folder": ARGS["offload_folder"],
        }
    return load_checkpoint_and_dispatch(model, str(ARGS["checkpoint"]), **options)


def main() -> None:
    torch.set_num_threads(THREADS)
    library, folder = ARGS["library"], Path(ARGS["checkpoint"])
    files = shard_files(folder)
    result: dict = {"threads": torch.get_num_threads()}
    if library != "reference":
        import transformers
        from transformers import LlamaConfig

        transformers.logging.set_verbosity_error()
        if library == "x":
            import x_bigmodel  # noqa: F401
        elif library == "accelerate":
            import accelerate  # noqa: F401
        config = LlamaConfig.from_pretrained(folder)
        model = build_empty(library, config).eval()
        # The largest block a forward brings in: a decoder layer, or the untied LM head if larger.
        layer = model.model.layers[0]
        result["block_bytes"] = max(
            tensor_bytes([*layer.parameters(), *layer.buffers()]), tensor_bytes(model.lm_head.parameters())
        )
        result["model_bytes"] = tensor_bytes(model.parameters())
    if ARGS["cache"] == "warm":
        read_all(files)
    else:
        evict(files)
    gc.collect()
    gpu = ARGS["scenario"] == "gpu"
    if gpu:  # the CUDA context, and the floor's buffers, before anything is timed
        buffers = (
            torch.empty(BUFFER, dtype=torch.uint8, pin_memory=True),
            torch.empty(BUFFER, dtype=torch.uint8, device="cuda:0"),
        )
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    baseline, before_io = status_bytes("VmRSS"), written_bytes()
    anon, file = status_bytes("RssAnon"), status_bytes("RssFile")
    reset_peak()
    start = time.perf_counter()
    if library == "reference":
        result["bytes_read"] = read_to_gpu(files, *buffers) if gpu else read_all(files)
        result["load_s"] = time.perf_counter() - start
        print(json.dumps(result))
        return
    model = load(library, model, files)
    if gpu:
        torch.cuda.synchronize()
    result["load_s"] = time.perf_counter() - start
    result["load_peak"] = status_bytes("VmHWM") - baseline
    result["written"] = written_bytes() - before_io
    result["offload_bytes"] = folder_bytes(ARGS.get("offload_folder"))
    result["cpu_bytes"] = cpu_param_bytes(model)
    left_on_meta = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    result["on_meta"] = len(left_on_meta)
    if ARGS["scenario"] != "disk" and left_on_meta:
        sys.exit(f"{library}: {len(left_on_meta)} parameters left on the meta device, e.g. {left_on_meta[:3]}")

    ids = torch.randint(0, model.config.vocab_size, (1, ARGS["seq"]), generator=torch.Generator().manual_seed(0))
    ids = ids.to("cuda:0") if gpu else ids
    times, peaks = [], []
    with torch.inference_mode():
        for _ in range(ARGS["forwards"]):
            gc.collect()
            reset_peak()
            start = time.perf_counter()
            logits = model(input_ids=ids).logits
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            peaks.append(status_bytes("VmHWM") - baseline)
    result["forward_s"] = times
    result["first_forward_s"] = times[0]
    result["forward_rest_s"] = statistics.median(times[1:]) if len(times) > 1 else times[0]
    result["load_first_forward_s"] = result["load_s"] + times[0]
    result["load_first_forward_peak"] = max(result["load_peak"], peaks[0])
    result["forward_peak"] = max(peaks)
    # What stays resident after the forwards: anonymous memory vs mapped file pages (page cache).
    result["rss_anon_end"] = status_bytes("RssAnon") - anon
    result["rss_file_end"] = status_bytes("RssFile") - file
    if gpu:
        result["gpu_peak"] = torch.cuda.max_memory_allocated()
    result["logits_sum"] = float(logits.double().sum())
    result["logits_head"] = logits[0, -1, :4].tolist()
    result["finite"] = bool(torch.isfinite(logits).all())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
