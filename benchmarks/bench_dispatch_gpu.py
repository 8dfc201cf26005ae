"""Loading a checkpoint onto a GPU: x-bigmodel vs Accelerate vs plain PyTorch vs the bytes' own floor.

    python benchmarks/bench_dispatch_gpu.py [--repeat 2] [--quick] [--cache-dir DIR]

bench_bigmodel.py's synthetic Llama (2.99 GB fp32 in 7 safetensors shards; --quick: its 28 MiB one)
loaded with `device_map={"": 0}`: x's and Accelerate's `load_checkpoint_and_dispatch`, and plain
PyTorch (`safetensors.torch.load_file(..., device="cuda:0")` per shard, one
`load_state_dict(assign=True)`), each in a fresh process (bigmodel_workers/worker.py, scenario
"gpu"), warm and cold page cache, round-robin, --repeat times. The floor ("reference") reads every
byte into a pinned 16 MiB buffer and copies it to the GPU: disk (or page cache) to host, host to
device, nothing else. Loads and forwards end with `torch.cuda.synchronize`. Rows: the load as a
ratio to that floor; load + first forward (1 x 128 token ids) as a ratio to the floor + plain's
steady forward; the steady forward as a ratio to plain's; peak GPU memory allocated as a ratio to
the parameter bytes. Every variant's logits must match plain PyTorch's on the same GPU.

Without a CUDA device it says so and exits 0, so `nox -s bench` and CI's quick smoke run it
anywhere. On a lent GPU machine a full run is about 2 minutes after the checkpoint is built.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_bigmodel import PRESETS, build_checkpoint, check_outputs, fmt, measure, median, per_repeat, ratio, version

MIB = 1 << 20
LIBS = ("reference", "plain", "accelerate", "x")
CACHES = ("warm", "cold")
TARGET_LOAD = 1.2  # x load / (read + copy to the GPU): the bytes' own cost, plus a little
TARGET_FORWARD = 1.02  # x steady forward / plain's: a single-device map adds no hook


def cuda_devices() -> int:
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def table(results: dict) -> list[str]:
    head = "| measure | cache | reference | plain | accelerate | x | x ratio | accelerate ratio | plain ratio | target (x) |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for cache in CACHES:
        floor = per_repeat(results, ("reference", "gpu", cache), "load_s")
        plain_steady = median(results, ("plain", "gpu", cache), "forward_rest_s") or 0.0
        plain_rest = per_repeat(results, ("plain", "gpu", cache), "forward_rest_s")
        rows = [
            ("load (s) / read + copy", "load_s", floor, TARGET_LOAD),
            ("load + 1st forward (s) / (read + copy + plain forward)", "load_first_forward_s", None, None),
            ("forward after the 1st (s) / plain", "forward_rest_s", plain_rest, TARGET_FORWARD),
        ]
        for label, field, bottom, target in rows:
            if bottom is None:
                bottom = [t + plain_steady if t is not None else None for t in floor]
            values = [median(results, (lib, "gpu", cache), field) for lib in LIBS]
            ratios = [ratio(results, (lib, "gpu", cache), field, bottom) for lib in ("x", "accelerate", "plain")]
            cells = [*map(fmt, values), *(fmt(r, ".2f") for r in ratios), "—" if target is None else f"≤ {target}"]
            lines.append(f"| {label} | {cache} | " + " | ".join(cells) + " |")
        peak = {lib: median(results, (lib, "gpu", cache), "gpu_peak") for lib in LIBS[1:]}
        params = median(results, ("plain", "gpu", cache), "model_bytes")
        shown = ["—", *(fmt(None if peak[lib] is None else peak[lib] / MIB) for lib in LIBS[1:])]
        shares = [
            None if peak[lib] is None or not params else peak[lib] / params for lib in ("x", "accelerate", "plain")
        ]
        lines.append(
            f"| peak GPU memory (MiB) / parameters | {cache} | "
            + " | ".join(shown + [fmt(v, ".2f") for v in shares])
            + " | — |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2, help="times every variant runs in a fresh process")
    parser.add_argument("--quick", action="store_true", help="the 28 MiB model, 1 repeat: a smoke")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "x-bench-bigmodel")
    # nox -s bench passes the same arguments to every benchmark; ignore the ones meant for others.
    args, _ = parser.parse_known_args()
    gpus = cuda_devices()
    if not gpus:
        print("bench_dispatch_gpu: no CUDA device here: nothing measured")
        return
    for dist in ("torch", "transformers", "safetensors", "accelerate", "x-bigmodel"):
        print(f"{dist} {version(dist)}")
    libs = [lib for lib in LIBS if lib != "accelerate" or version("accelerate") != "not installed"]
    # Ten forwards: a GPU forward takes milliseconds, and the steady figure is the median of the rest.
    preset = PRESETS["quick" if args.quick else "full"] | {"forwards": 10}
    folder = args.cache_dir / preset["name"]
    made = build_checkpoint(folder, preset)
    print(f"checkpoint: {folder} ({made['bytes'] / 1e9:.2f} GB), {gpus} CUDA device(s), loading onto GPU 0")
    threads = len(os.sched_getaffinity(0))
    variants = [(lib, "gpu", cache) for cache in CACHES for lib in libs]
    repeat = 1 if args.quick else max(1, args.repeat)
    results, errors = measure(variants, folder, preset, repeat, threads, subprocess.run)
    print(f"\nmedians over {repeat} repeat(s) of fresh processes; ratios: median of per-repeat ratios")
    print("\n".join(table(results)))
    warm, cold = (median(results, ("reference", "gpu", cache), "load_s") for cache in CACHES)
    if warm and cold and cold < 1.2 * warm:
        print("warning: cold reads were about as fast as warm ones: the page cache may not have been evicted")
    failures = [f"{'/'.join(key)} failed: {why}" for key, why in errors.items()]
    failures += check_outputs(results, ("plain", "gpu", "warm"))
    if failures:
        sys.exit("\n".join(f"error: {failure}" for failure in failures))


if __name__ == "__main__":
    main()
