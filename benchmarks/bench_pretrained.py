"""x_bigmodel.from_pretrained vs transformers + Accelerate from_pretrained(device_map=...), side by side.

    python benchmarks/bench_pretrained.py [--quick] [--repeat 3] [--cache-dir DIR]

The checkpoint is bench_bigmodel.py's synthetic Llama (LlamaForCausalLM: hidden 2048, 12 layers,
intermediate 5632, vocab 32000, untied head, seeded random weights), 2.99 GB fp32 in 7 safetensors
shards, built once by ``bigmodel_workers/make_checkpoint.py`` into --cache-dir (default
$TMPDIR/x-bench-bigmodel, shared with bench_bigmodel.py) and reused while its spec matches. Each
(library, scenario, cache state) runs in a fresh process (this script with --worker); within a repeat,
x and transformers run back to back for each scenario and cache state, in alternating order. Shown
are medians, and ratios are medians of the per-repeat ratios x/theirs. --quick, a smoke: its 28 MiB
one (hidden 256, 4 layers, vocab 8192), 1 repeat, and the build and workers forked from one
interpreter that imported torch and transformers (bigmodel_workers/forks.py): 7-18 s on 2 cores at
load average 1-3 after bench_bigmodel's quick run built that checkpoint, 17 s building it itself.

Scenarios: ``cpu`` (``device_map={"": "cpu"}``) and ``disk`` (``device_map="auto"``,
``max_memory={"cpu": "1GiB"}`` (24 MiB with --quick), an empty offload folder). Cache states: warm
(every shard read once, untimed, just before) and cold (``os.sync()``, then
``posix_fadvise(DONTNEED)`` on every shard: no root needed). Measured: the load call's wall time;
peak RSS rise over load + generate (VmHWM after a clear_refs reset, minus VmRSS before the load;
mapped file pages count, for both); RSS rise right after the load; bytes written during the load
(/proc/self/io write_bytes) and left in the offload folder; first-token time
(``generate(max_new_tokens=1)``, 8 prompt tokens), load + first token, and steady time per token
(a 10-token generate minus a 2-token one, over 8). Greedy tokens of both must agree. The load
average before and after is printed: the figures are only as quiet as the machine. Nothing is
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

from bench_bigmodel import PRESETS, build_checkpoint, version
from bigmodel_workers.forks import Forks

PROMPT = [[1, 306, 4658, 278, 6593, 310, 2834, 338]]  # token ids: every preset's vocabulary holds them


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
    if args["cache"] == "cold":
        os.sync()  # dirty pages cannot be dropped
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
    rss_load = _status("VmRSS") - rss0
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
        "rss_load": rss_load,
        "load_first_s": load_s + first_s,
        "written": written,
        "left": left,
        "first_s": first_s,
        "steady_s": steady_s,
        "tokens": out[0].tolist(),
        # transformers sets no hf_device_map when everything sits on one device.
        "map": sorted(set(map(str, getattr(model, "hf_device_map", {"": "cpu"}).values()))),
    }


def run(lib: str, scenario: str, cache: str, folder: Path, budget: str, runner=subprocess.run) -> dict | str:
    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=folder.parent))
    args = {"library": lib, "scenario": scenario, "cache": cache, "checkpoint": str(folder), "cpu_budget": budget}
    args["offload"] = str(scratch / "offload") if scenario == "disk" else None
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(scratch)}
    try:
        argv = [sys.executable, __file__, "--worker", json.dumps(args)]
        proc = runner(argv, capture_output=True, text=True, env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return f"failed: {lines[-1] if lines else proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


FIELDS = [
    ("load_s", 1, " s"),
    ("first_s", 1, " s"),
    ("load_first_s", 1, " s"),
    ("steady_s", 1, " s"),
    ("rss_load", 2**20, " MiB"),
    ("rss_rise", 2**20, " MiB"),
    ("written", 2**20, " MiB"),
    ("left", 2**20, " MiB"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke: a 28 MiB model, 1 round, forked workers")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every variant (default 3)")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "x-bench-bigmodel")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        print(json.dumps(worker(json.loads(opts.worker))))
        return
    preset = PRESETS["quick" if opts.quick else "full"]
    rounds = 1 if opts.quick else opts.repeat
    folder = opts.cache_dir / preset["name"]
    forks = Forks({**os.environ, "HF_HUB_OFFLINE": "1"}) if opts.quick else None  # for the build and every worker
    runner = forks.run if forks else subprocess.run
    build_checkpoint(folder, preset, runner)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(f"checkpoint: {folder} ({size / 1e9:.2f} GB), disk scenario cpu budget {preset['cpu_budget']}")
    print(f"torch {version('torch')}, transformers {version('transformers')}, {os.cpu_count()} CPUs")
    print("load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    keys = [(s, c) for s in ("cpu", "disk") for c in ("warm", "cold")]
    results: dict[tuple[str, str, str], list[dict | None]] = {}
    for r in range(rounds):
        for scenario, cache in keys:
            for lib in ("x", "hf") if r % 2 == 0 else ("hf", "x"):
                got = run(lib, scenario, cache, folder, preset["cpu_budget"], runner)
                if isinstance(got, str):
                    print(f"{lib} {scenario} {cache}: {got}")
                results.setdefault((lib, scenario, cache), []).append(None if isinstance(got, str) else got)
    if forks:
        forks.close()
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))

    def med(lib: str, scenario: str, cache: str, field: str) -> float | None:
        runs = [run[field] for run in results.get((lib, scenario, cache), []) if run]
        return statistics.median(runs) if runs else None

    def ratio(scenario: str, cache: str, field: str) -> str:
        pairs = zip(results.get(("x", scenario, cache), []), results.get(("hf", scenario, cache), []), strict=True)
        ratios = [ours[field] / theirs[field] for ours, theirs in pairs if ours and theirs and theirs[field]]
        return f"{statistics.median(ratios):.2f}x" if ratios else "n/a"

    def show(value: float | None, scale: float = 1.0, unit: str = "") -> str:
        return "n/a" if value is None else f"{value / scale:.3g}{unit}"

    failed = False
    print("| scenario | cache | measure | x_bigmodel | transformers+Accelerate | x / theirs |")
    print("|---|---|---|---|---|---|")
    for scenario, cache in keys:
        for field, scale, unit in FIELDS:
            ours, theirs = med("x", scenario, cache, field), med("hf", scenario, cache, field)
            print(
                f"| {scenario} | {cache} | {field} | {show(ours, scale, unit)} | {show(theirs, scale, unit)} "
                f"| {ratio(scenario, cache, field)} |"
            )
        pairs = zip(results.get(("x", scenario, cache), []), results.get(("hf", scenario, cache), []), strict=True)
        agree = [bool(a and b and a["tokens"] == b["tokens"]) for a, b in pairs]
        maps = {str(run["map"]) for run in results.get(("x", scenario, cache), []) if run}
        print(f"| {scenario} | {cache} | same greedy tokens | {all(agree) and bool(agree)} | device map {maps} | |")
        failed = failed or not (agree and all(agree))
    if failed:  # a fast wrong answer is no answer: the smoke fails, as bench_bigmodel's does
        sys.exit("bench_pretrained: a run failed or the two libraries generated different tokens (see above)")


if __name__ == "__main__":
    main()
