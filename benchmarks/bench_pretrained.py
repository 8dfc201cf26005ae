"""x_bigmodel.from_pretrained vs transformers + Accelerate from_pretrained(device_map=...), side by side.

    python benchmarks/bench_pretrained.py [--quick] [--repeat 2] [--cache-dir DIR]

The checkpoint is a synthetic Llama (LlamaForCausalLM, random weights, untied head) saved by
``save_pretrained`` as sharded safetensors into --cache-dir (default $TMPDIR/x-bench-pretrained),
reused while its spec matches: ~1.2 GB fp32 by default (hidden 1536, 10 layers), ~150 MB with
--quick. Each (library, scenario, cache state) runs in a fresh process (this script with
--worker), round-robin, --repeat times; shown are medians, and x/theirs ratios.

Scenarios: ``cpu`` (``device_map={"": "cpu"}``) and ``disk`` (``device_map="auto"``,
``max_memory={"cpu": <two thirds of the model>}``, an empty offload folder). Cache states: warm (every
shard read once, untimed, just before) and cold (``posix_fadvise(DONTNEED)`` on every shard).
Measured: the load call's wall time; peak RSS rise over load + generate (VmHWM after a
clear_refs reset, minus VmRSS before the load); bytes written during the load (/proc/self/io
write_bytes) and left in the offload folder; first-token time (``generate(max_new_tokens=1)``)
and steady time per token (a 10-token generate minus a 2-token one, over 8). Greedy tokens of both must agree. Nothing is
asserted: the script prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = {
    "full": {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 10, "vocab_size": 32000},
    "quick": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "vocab_size": 32000},
}
SHARD = "200MB"
PROMPT = [[1, 306, 4658, 278, 6593, 310, 2834, 338]]


def build(folder: Path, preset: str) -> None:
    spec = {"preset": PRESETS[preset], "shard": SHARD}
    stamp = folder / "spec.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == spec:
        return
    shutil.rmtree(folder, ignore_errors=True)
    import torch
    import transformers

    config = transformers.LlamaConfig(
        **PRESETS[preset], num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size=SHARD)
    stamp.write_text(json.dumps(spec))


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def _written() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))


def worker(args: dict) -> dict:
    """One load + generate in this (fresh) process."""
    import torch

    folder = Path(args["checkpoint"])
    shards = sorted(folder.glob("*.safetensors"))
    for shard in shards:
        with open(shard, "rb") as f:
            if args["cache"] == "warm":
                while f.read(1 << 24):
                    pass
            else:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    kwargs: dict = {"device_map": {"": "cpu"}}
    if args["scenario"] == "disk":
        kwargs = {"device_map": "auto", "max_memory": {"cpu": args["cpu_budget"]}, "offload_folder": args["offload"]}
    # Imported before the clock starts for both: from_pretrained imports transformers when called.
    import transformers
    import transformers.models.llama.modeling_llama

    if args["library"] == "x":
        from x_bigmodel import from_pretrained

        load = lambda: from_pretrained(folder, **kwargs)  # noqa: E731
    else:
        load = lambda: transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)  # noqa: E731
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    rss0, written0, t0 = _status("VmRSS"), _written(), time.perf_counter()
    model = load()
    load_s, written = time.perf_counter() - t0, _written() - written0
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
        two_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
        steady_s = (time.perf_counter() - t0 - two_s) / 8  # tokens 3..10, once warm
    left = sum(p.stat().st_size for p in Path(args["offload"]).rglob("*") if p.is_file()) if args["offload"] else 0
    return {
        "load_s": load_s,
        "rss_rise": _status("VmHWM") - rss0,
        "written": written,
        "left": left,
        "first_s": first_s,
        "steady_s": steady_s,
        "tokens": out[0].tolist(),
        # transformers sets no hf_device_map when everything sits on one device.
        "map": sorted(set(map(str, getattr(model, "hf_device_map", {"": "cpu"}).values()))),
    }


def run(lib: str, scenario: str, cache: str, folder: Path, budget: int) -> dict | str:
    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=folder.parent))
    args = {"library": lib, "scenario": scenario, "cache": cache, "checkpoint": str(folder), "cpu_budget": budget}
    args["offload"] = str(scratch / "offload") if scenario == "disk" else None
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(scratch)}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(args)], capture_output=True, text=True, env=env
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return f"failed: {lines[-1] if lines else proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "x-bench-pretrained")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        print(json.dumps(worker(json.loads(opts.worker))))
        return
    preset = "quick" if opts.quick else "full"
    folder = opts.cache_dir / f"llama-{preset}"
    build(folder, preset)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    budget = size * 2 // 3
    print(f"checkpoint: {folder} ({size / 2**20:.0f} MiB), disk scenario cpu budget {budget / 2**20:.0f} MiB")
    keys = [(s, c) for s in ("cpu", "disk") for c in ("warm", "cold")]
    results: dict[tuple[str, str, str], list[dict]] = {}
    for r in range(opts.repeat):
        for lib in ("x", "hf") if r % 2 == 0 else ("hf", "x"):
            for scenario, cache in keys:
                got = run(lib, scenario, cache, folder, budget)
                if isinstance(got, str):
                    print(f"{lib} {scenario} {cache}: {got}")
                    continue
                results.setdefault((lib, scenario, cache), []).append(got)

    def med(lib: str, scenario: str, cache: str, field: str) -> float | None:
        runs = results.get((lib, scenario, cache))
        return statistics.median(run[field] for run in runs) if runs else None

    def show(value: float | None, scale: float = 1.0, unit: str = "") -> str:
        return "n/a" if value is None else f"{value / scale:.3g}{unit}"

    fields = [("load_s", 1, " s"), ("rss_rise", 2**20, " MiB"), ("written", 2**20, " MiB"), ("left", 2**20, " MiB")]
    fields += [("first_s", 1, " s"), ("steady_s", 1, " s")]
    print("| scenario | cache | measure | x_bigmodel | transformers+Accelerate | x / theirs |")
    print("|---|---|---|---|---|---|")
    for scenario, cache in keys:
        for field, scale, unit in fields:
            ours, theirs = med("x", scenario, cache, field), med("hf", scenario, cache, field)
            ratio = f"{ours / theirs:.2f}x" if ours is not None and theirs else "n/a"
            print(
                f"| {scenario} | {cache} | {field} | {show(ours, scale, unit)} | {show(theirs, scale, unit)} | {ratio} |"
            )
        pair = [results.get((lib, scenario, cache), [{}])[0] for lib in ("x", "hf")]
        agree = pair[0].get("tokens") == pair[1].get("tokens") and "tokens" in pair[0]
        print(f"| {scenario} | {cache} | same greedy tokens | {agree} | device map {pair[0].get('map')} | |")


if __name__ == "__main__":
    main()
