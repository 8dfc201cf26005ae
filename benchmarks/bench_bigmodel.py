"""Big-model loading: x-bigmodel vs Accelerate vs plain PyTorch vs reading the bytes, measured side by side.

    nox -s bench            # or: python benchmarks/bench_bigmodel.py [--repeat 2] [--quick] [--cache-dir DIR]

The checkpoint is a synthetic Llama (transformers LlamaForCausalLM: hidden 2048, 12 layers, 16
heads, intermediate 5632, vocab 32000, untied head: 2.99 GB fp32, random weights) saved by
`save_pretrained(max_shard_size="500MB")` as 7 safetensors shards. It is built once (seeded,
parameter by parameter from the meta device: ~1.1x the model in RAM, ~25 s) into
$TMPDIR/x-bench-bigmodel/llama-3g and reused while its spec matches (bigmodel_workers/make_checkpoint.py).
--quick, a smoke: a 28 MiB one (hidden 256, 4 layers, vocab 8192; cpu budget 24 MiB: with less,
Accelerate puts everything on disk and then fails), 1 repeat, and the build and workers forked from
one interpreter that imported torch and transformers (bigmodel_workers/forks.py).

Every (library, scenario, cache state) runs in a fresh process (bigmodel_workers/worker.py) with
torch and OMP threads = the usable cores; the variants run round-robin, their order rotated every
repeat, --repeat times (default 2); shown are medians, and ratios are medians of per-repeat ratios.
Cache states: warm (the worker reads every shard once, untimed, just before) and cold (`os.sync()`,
then `posix_fadvise(DONTNEED)` on every shard: no root needed). Scenarios and what is measured:

1. all on CPU (`device_map={"": "cpu"}`): the load call vs the physical reference, reading every byte
   of the shards once (`readinto` into a reused buffer); load + first forward (1 x 128 token ids), since
   a lazy load (memory-mapped tensors) defers its reads to the first forward, shown as a ratio to the
   reference read + plain PyTorch's steady forward; the steady forward. Plain PyTorch: the model built
   on meta, all shards read with safetensors' `load_file`, one `load_state_dict(assign=True)`.
2. peak RSS increase (VmHWM, reset through /proc/self/clear_refs, minus VmRSS before the load, i.e.
   after imports and the empty model) over load + first forward, as a ratio to the parameter bytes
   the device map puts on the CPU. Mapped file pages count: they are resident, though reclaimable.
3. disk offload (max_memory {"cpu": "1GiB", "disk": "100GiB"}, LlamaDecoderLayer unsplit, an empty
   offload folder, deleted after each run, like the worker's TMPDIR; device_map="sequential", because
   Accelerate's "auto" fails with a "disk" key; without GPUs both infer the same map): load time as a
   ratio to the same library's all-CPU load; bytes written during the load (/proc/self/io write_bytes)
   and left in the offload folder; peak RSS increase over the forwards as a ratio to 1 GiB + the
   largest block; the first forward and the median of the other two, as ratios to the library's
   all-CPU forward. "One block" is the largest unit the forward brings in from disk: here the untied
   lm_head, 250 MiB (a decoder layer is 196 MiB).

Every variant's logits must agree with plain PyTorch's: a fast wrong answer is no answer. Each row says
whether x meets its target; timings are reported, never asserted. On 2 cores and 24 GiB a full run takes
~6 minutes (~3 per repeat, +25 s for a first build), --quick 20-38 s with its build (load 1-3). The
machine should be otherwise idle: workers use every core, so another busy process stalls their parallel
regions and forwards can swing several-fold; the script says how much CPU other processes used.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bigmodel_workers.forks import Forks

WORKERS = Path(__file__).parent / "bigmodel_workers"
MIB = 1 << 20

TARGET_LOAD = 1.2  # x load / reference read, all on CPU; Accelerate measured ~7.6x
TARGET_RSS = 1.1  # x peak RSS increase / bytes placed in RAM; plain PyTorch measured ~2.1x
TARGET_DISK_LOAD = 1.5  # x disk-offload load / x all-CPU load; Accelerate measured 4.15x
TARGET_DISK_RSS = 1.0  # x peak RSS over the forwards / (cpu budget + one block); Accelerate ~2.5 GB
TARGET_DISK_FORWARD = 3.0  # x disk-offload forward / x all-CPU forward; Accelerate measured ~6x
TARGET_WRITTEN_MIB = 1.0  # "0" for a safetensors checkpoint: no weight bytes written (an index file may be)

PRESETS = {
    "full": {
        "name": "llama-3g",
        "config": {"hidden_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 16, "intermediate_size": 5632},
        "shard_size": "500MB",
        "cpu_budget": "1GiB",
        "cpu_budget_bytes": 1 << 30,
        "forwards": 3,
    },
    "quick": {  # 28 MiB: lm_head 8 MiB, a decoder layer 3; the budget keeps the embedding and 2 layers in RAM
        "name": "llama-30m",
        "config": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 688}
        | {"vocab_size": 8192},
        "shard_size": "8MB",
        "cpu_budget": "24MiB",
        "cpu_budget_bytes": 24 << 20,
        "forwards": 2,
    },
}
COMMON_CONFIG = {"vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 2048}
SEQ = 128

LIBS = ("reference", "plain", "accelerate", "x")
CACHES = ("warm", "cold")
VARIANTS = [(lib, "cpu", cache) for cache in CACHES for lib in LIBS] + [
    (lib, "disk", cache) for cache in CACHES for lib in ("accelerate", "x")
]
Key = tuple[str, str, str]  # library, scenario, cache
Results = dict[Key, list[dict | None]]  # one entry per repeat, None where the worker failed

# label, scenario, worker field, shown in MiB, denominator of the ratios (see rows()), target for x
ROWS = (
    ("CPU: load (s) / reference read", "cpu", "load_s", False, "read", TARGET_LOAD),
    ("CPU: load + 1st forward (s) / (read + plain forward)", "cpu", "load_first_forward_s", False, "floor", None),
    ("CPU: forward after the 1st, median (s) / plain", "cpu", "forward_rest_s", False, "plain", None),
    (
        "CPU: peak RSS rise, load + 1st forward (MiB) / in RAM",
        "cpu",
        "load_first_forward_peak",
        True,
        "cpu_bytes",
        TARGET_RSS,
    ),
    ("disk: load (s) / own CPU load", "disk", "load_s", False, "load_s", TARGET_DISK_LOAD),
    ("disk: load + 1st forward (s) / own CPU", "disk", "load_first_forward_s", False, "load_first_forward_s", None),
    ("disk: bytes written by the load (MiB)", "disk", "written", True, None, TARGET_WRITTEN_MIB),
    ("disk: offload folder after the load (MiB)", "disk", "offload_bytes", True, None, TARGET_WRITTEN_MIB),
    ("disk: peak RSS rise, forwards (MiB) / (budget + block)", "disk", "forward_peak", True, "budget", TARGET_DISK_RSS),
    ("disk: 1st forward (s) / own CPU forward", "disk", "first_forward_s", False, "forward_rest_s", None),
    (
        "disk: forward after the 1st, median (s) / own CPU",
        "disk",
        "forward_rest_s",
        False,
        "forward_rest_s",
        TARGET_DISK_FORWARD,
    ),
)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_busy_s() -> float:
    """CPU seconds all processes have used since boot (non-idle time in /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and its finished workers."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def x_missing() -> str | None:
    """Why x's API under test cannot be used, or None."""
    probe = "import x_bigmodel; x_bigmodel.init_empty_weights; x_bigmodel.load_checkpoint_and_dispatch"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return proc.stderr.strip().splitlines()[-1] if proc.returncode else None


def build_checkpoint(folder: Path, preset: dict, run=subprocess.run) -> dict:
    spec = {"folder": str(folder), "config": {**COMMON_CONFIG, **preset["config"]}}
    spec |= {"shard_size": preset["shard_size"], "seed": 0}
    proc = run([sys.executable, str(WORKERS / "make_checkpoint.py"), json.dumps(spec)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"building the checkpoint failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worker_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}


def run_worker(key: Key, folder: Path, preset: dict, threads: int, run=subprocess.run) -> tuple[dict | None, str]:
    """One fresh worker; (its result, "") or (None, why it failed).

    Its offload folder and its temporary files (TMPDIR: Accelerate stages the CPU part of a disk-offload
    load there) live in a scratch folder beside the checkpoint, deleted afterwards even if it failed.
    """
    lib, scenario, cache = key
    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=folder.parent))
    offload = scratch / "offload" if scenario == "disk" else None
    (scratch / "tmp").mkdir()
    if offload:
        offload.mkdir()
    args = {"library": lib, "scenario": scenario, "cache": cache, "checkpoint": str(folder), "seq": SEQ}
    args |= {"forwards": preset["forwards"], "cpu_budget": preset["cpu_budget"], "threads": threads}
    args["offload_folder"] = str(offload) if offload else None
    env = {**worker_env(threads), "TMPDIR": str(scratch / "tmp")}
    try:
        argv = [sys.executable, str(WORKERS / "worker.py"), json.dumps(args)]
        proc = run(argv, capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "timed out after 900 s"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return None, f"exit {proc.returncode}: {lines[-1] if lines else ''}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def measure(variants: list[Key], folder: Path, preset: dict, repeat: int, threads: int, run) -> tuple[Results, dict]:
    results: Results = {key: [] for key in variants}
    errors: dict[Key, str] = {}
    for rep in range(repeat):
        start = time.perf_counter()
        order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
        print(f"repeat {rep + 1}/{repeat}: ", end="", flush=True)
        for key in order:
            result, error = run_worker(key, folder, preset, threads, run)
            results[key].append(result)
            if error:
                errors[key] = error
            print("." if result else "F", end="", flush=True)
        print(f" {time.perf_counter() - start:.0f} s", flush=True)
    return results, errors


def median(results: Results, key: Key, field: str) -> float | None:
    values = [r[field] for r in results.get(key, []) if r is not None and r.get(field) is not None]
    return statistics.median(values) if values else None


def per_repeat(results: Results, key: Key, field: str) -> list[float | None]:
    return [r.get(field) if r else None for r in results.get(key, [])]


def ratio(results: Results, top: Key, field: str, bottom: list[float | None] | float) -> float | None:
    """Median over repeats of top's field / bottom (per repeat, paired, or one number)."""
    ratios = []
    for rep, value in enumerate(per_repeat(results, top, field)):
        den = bottom if isinstance(bottom, (int, float)) else (bottom[rep] if rep < len(bottom) else None)
        if value is not None and den:
            ratios.append(value / den)
    return statistics.median(ratios) if ratios else None


def fmt(value: float | None, digits: str = ".3g") -> str:
    if value is None:
        return "—"
    return f"{value:{digits}}" if abs(value) < 1000 else f"{value:.0f}"


def verdict(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    return "meets target" if value <= target else "misses target"


def rows(results: Results, budget: int) -> list[list[str]]:
    """measure, cache, reference, plain, accelerate, x, x ratio, accelerate ratio, plain ratio, target, verdict."""

    def denominators(lib: str, cache: str, field: str, bottom) -> list[float | None] | float:
        """ "read": the reference read; "floor": it + plain's steady forward; "plain": plain's same field;
        "budget": the cpu budget + one block; else that field of the library's own all-CPU run."""
        if bottom in ("read", "floor"):
            read = per_repeat(results, ("reference", "cpu", cache), "load_s")
            extra = 0.0 if bottom == "read" else median(results, ("plain", "cpu", cache), "forward_rest_s")
            return [t + extra if t is not None and extra is not None else None for t in read]
        if bottom == "plain":
            return per_repeat(results, ("plain", "cpu", cache), field)
        return budget if bottom == "budget" else per_repeat(results, (lib, "cpu", cache), bottom)

    out = []
    for label, scenario, field, mib, bottom, target in ROWS:
        for cache in CACHES:
            values = [median(results, (lib, scenario, cache), field) for lib in LIBS]
            values = [None if v is None else v / MIB if mib else v for v in values]
            ratios = {}
            if bottom is not None:
                libs = LIBS[1:] if scenario == "cpu" else ("accelerate", "x")
                ratios = {
                    lib: ratio(results, (lib, scenario, cache), field, denominators(lib, cache, field, bottom))
                    for lib in libs
                }
            judged = ratios.get("x") if bottom is not None else values[LIBS.index("x")]
            shown = [fmt(ratios.get(lib), ".2f") for lib in ("x", "accelerate", "plain")]
            tgt = "—" if target is None else f"≤ {target:.2f}" if bottom is not None else f"≤ {target:g} MiB (≈ 0)"
            ok = "—" if target is None else verdict(judged, target)
            out.append([label, cache, *map(fmt, values), *shown, tgt, ok])
    return out


def check_outputs(results: Results, against: Key = ("plain", "cpu", "warm")) -> list[str]:
    """Every run's logits must match plain PyTorch's (all on CPU, warm): the same weights went in."""
    refs = [r for r in results.get(against, []) if r]
    if not refs:
        return ["no plain PyTorch run to compare outputs with"]
    want, problems = refs[0], []
    for key, runs in results.items():
        for r in runs:
            if not r or "logits_sum" not in r:
                continue
            close = abs(r["logits_sum"] - want["logits_sum"]) <= 1e-3 * (1 + abs(want["logits_sum"]))
            close &= all(
                abs(a - b) <= 1e-4 * (1 + abs(b)) for a, b in zip(r["logits_head"], want["logits_head"], strict=True)
            )
            if not (close and r["finite"]):
                problems.append(
                    f"{'/'.join(key)}: logits differ from plain PyTorch's ({r['logits_sum']} vs {want['logits_sum']})"
                )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2, help="times every variant runs in a fresh process")
    parser.add_argument("--quick", action="store_true", help="a 28 MiB model, 1 repeat, forked workers: a smoke")
    parser.add_argument("--without-x", action="store_true", help="run the other rows if x's API is missing")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "x-bench-bigmodel")
    # nox -s bench passes the same arguments to every benchmark; ignore the ones meant for others.
    args, _ = parser.parse_known_args()

    print(f"python {platform.python_version()}")
    for dist in ("torch", "transformers", "safetensors", "accelerate", "x-bigmodel"):
        print(f"{dist} {version(dist)}")
    threads = len(os.sched_getaffinity(0))
    print(f"CPUs: {os.cpu_count()} ({threads} usable; workers use {threads} threads)")
    variants = list(VARIANTS)
    if version("accelerate") == "not installed":
        print("accelerate is not installed: its column is left out (nox -s bench installs it)")
        variants = [v for v in variants if v[0] != "accelerate"]
    missing = x_missing()
    if missing and not args.without_x:
        sys.exit(f"x: not available ({missing}); --without-x runs the other rows")
    if missing:
        print(f"x: not available ({missing})")
        variants = [v for v in variants if v[0] != "x"]

    preset = PRESETS["quick" if args.quick else "full"]
    repeat = 1 if args.quick else max(1, args.repeat)
    folder = args.cache_dir / preset["name"]
    started, busy_before = time.perf_counter(), machine_busy_s() - own_cpu_s()
    forks = Forks(worker_env(threads)) if args.quick else None  # for the build and every worker
    run = forks.run if forks else subprocess.run
    made = build_checkpoint(folder, preset, run)
    shards = sorted(folder.glob("*.safetensors"))
    how = "reused" if made["reused"] else f"built in {made['seconds']:.0f} s"
    print(f"checkpoint: {folder} ({made['bytes'] / 1e9:.2f} GB fp32 in {len(shards)} safetensors shards, {how})")

    results, errors = measure(variants, folder, preset, repeat, threads, run)
    if forks:
        forks.close()  # its workers' CPU time counts as own_cpu_s() once it has been waited for
    print(f"({time.perf_counter() - started:.0f} s)")
    others = (machine_busy_s() - own_cpu_s() - busy_before) / ((time.perf_counter() - started) * threads)
    if others > 0.05:
        # Workers run one thread per core: another busy process stalls their parallel regions (OpenMP waits
        # for its slowest thread), so forward times can swing several-fold.
        print(f"warning: other processes used {others:.0%} of the CPUs during the run: timings are noisy")
    any_run = next((r for runs in results.values() for r in runs if r and "block_bytes" in r), None)
    block = any_run["block_bytes"] if any_run else 0
    print(
        f"\nmedians over {repeat} repeat(s) of fresh processes; ratios: median of per-repeat ratios; "
        f"largest block (lm_head or a decoder layer) = {block / MIB:.0f} MiB, disk offload cpu budget {preset['cpu_budget']}"
    )
    print(
        "| measure | cache | reference | plain | accelerate | x | x ratio | accelerate ratio | plain ratio | target (x) | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows(results, preset["cpu_budget_bytes"] + block):
        print("| " + " | ".join(row) + " |")

    budget = (preset["cpu_budget_bytes"] + block) / MIB
    print(
        f"CPU: all on the CPU; disk: disk offload; read: the reference read; own CPU: the same library's all-CPU "
        f"run (same cache state, paired by repeat); in RAM: parameter bytes placed on the CPU; budget + block = "
        f"{budget:.0f} MiB"
    )
    for scenario in ("cpu", "disk"):
        cells = []
        for key in [(lib, scenario, cache) for cache in CACHES for lib in LIBS[1:]]:
            anon, mapped = median(results, key, "rss_anon_end"), median(results, key, "rss_file_end")
            if anon is not None and mapped is not None:
                cells.append(f"{key[0]} {key[2]} {anon / MIB:.0f} + {mapped / MIB:.0f}")
        if cells:
            print(f"{scenario}: resident after the forwards, anonymous + mapped file (MiB): {', '.join(cells)}")
    for key in [(lib, "disk", cache) for cache in CACHES for lib in ("accelerate", "x")]:
        placed = median(results, key, "cpu_bytes")
        if placed is not None:
            print(f"{'/'.join(key)}: {placed / MIB:.0f} MiB of parameters placed on the CPU, the rest on disk")
    for key, runs in results.items():
        for r in runs:
            if r and r.get("threads") != threads:
                print(f"warning: {'/'.join(key)} ran on {r.get('threads')} torch threads, not {threads}")
                break
    warm = median(results, ("reference", "cpu", "warm"), "load_s")
    cold = median(results, ("reference", "cpu", "cold"), "load_s")
    if warm and cold and cold < 1.2 * warm:
        print("warning: cold reads were about as fast as warm ones: the page cache may not have been evicted")
    if missing:
        print(f"x: not available ({missing})")
    problems = [f"{'/'.join(key)} failed: {why}" for key, why in errors.items()] + check_outputs(results)
    for problem in problems:
        print(f"error: {problem}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
