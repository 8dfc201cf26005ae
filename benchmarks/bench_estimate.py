"""Start-up cost of `x-estimate` vs `accelerate estimate-memory` vs `import torch`, one run.

    nox -s bench            # or: python benchmarks/bench_estimate.py [--repeat 5] [--quick]

Each command runs as a fresh subprocess on the same local bert-base-cased config folder: what a
user waits for is interpreter start, imports and the meta-device build, so in-process timing would
hide most of it. Reported: median wall time of --repeat runs (after one untimed warm-up of each),
ratios to `python -c "import torch"` (the floor any torch-based tool pays) and x-estimate/Accelerate.
Importing transformers' BERT module (``transformers.models.bert.modeling_bert``) is timed too: it is
the floor of any tool that builds the real model class, whatever it does after.
x-estimate caches summaries by config content, so it is timed twice: with --no-cache (a first
estimate, building the model as Accelerate does) and plain (a repeat estimate, answered from a
cache that this script keeps in a temporary folder). Accelerate only reads Hub repos, so its Hub
lookup is replaced by the local config.json; the rest of its command runs unchanged. Both tools'
tables are checked, because a fast wrong answer is no answer.

A second table times the simulated training estimate (issue 18) on examples/configs/llama-3.1-8b
at 8192 tokens (`--seq-len 8192 --fits 80GiB`): importing transformers' Llama module (the floor),
the formula estimate (`--method formula`), the simulated one (a real step on fake tensors) and
`accelerate estimate-memory` on the same config (no training step: a sum of sizes). ``--fits``
makes the simulated step a CUDA one (``--device cuda``: CUDA's kernels and the caching allocator's
reserved figure); the CPU-kernel simulation (``--device cpu``) is timed beside it. Target: the
simulated (CUDA) estimate within SIM_TARGET times the import floor.

--quick, a smoke, times each command once: its checked first run (the cached estimate: its second,
which answers from the cache the first filled), with no warm-up: 46-63 s on 2 cores at load
average 1-3.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.4  # x-estimate may cost at most this many times `import torch`
SIM_TARGET = 3.0  # the simulated 8B estimate may cost at most this many times importing modeling_llama
LLAMA_8B = Path(__file__).resolve().parent.parent / "examples" / "configs" / "llama-3.1-8b"

ACCELERATE = """
import json, sys, types
import accelerate.commands.estimate as estimate
with open(sys.argv[1] + "/config.json") as f:
    config = json.load(f)
# create_empty_model looks verify_on_hub up in this module's globals: patching here is enough.
estimate.verify_on_hub = lambda repo, token=None: types.SimpleNamespace(library_name="transformers", config=config)
estimate.estimate_command(estimate.estimate_command_parser().parse_args())
"""

# Expected float32 Total Size. They differ on purpose: x-estimate builds the architecture the
# config names (BertForMaskedLM), Accelerate builds AutoModel (BertModel, 413.18 MiB); with
# --base-model x-estimate builds BertModel too and shows 413.18.
COLD, CACHED, ACC = "x-estimate --no-cache", "x-estimate (cached)", "accelerate estimate-memory"
FLOOR = "import modeling_bert"
EXPECTED = {COLD: "413.30", CACHED: "413.30", ACC: "413.18"}


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(name: str, argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def float32_total(out: str) -> str:
    """The float32 Total Size number from either tool's table (markdown `|` or box-drawing `│`)."""
    rows = [
        [c.strip() for c in re.split(r"[|│]", line)[1:-1]] for line in out.splitlines() if re.match(r"\s*[|│]", line)
    ]
    header = next((r for r in rows if "Total Size" in r), None)
    row = next((r for r in rows if r and r[0] == "float32"), None)
    if header is None or row is None:
        return "no table"
    return row[header.index("Total Size")].split()[0]


def make_config(folder: str) -> None:
    from transformers import BertConfig

    BertConfig(vocab_size=28996, architectures=["BertForMaskedLM"]).save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one timed run of each command")
    # nox -s bench passes the same arguments to every benchmark; ignore the ones meant for others.
    args, _ = parser.parse_known_args()
    if args.quick:
        args.repeat = 1

    for dist in ("torch", "transformers", "accelerate", "x-estimate"):
        print(f"{dist} {version(dist)}")
    x_estimate = shutil.which("x-estimate", path=str(Path(sys.executable).parent))
    if x_estimate is None:
        sys.exit(f"x-estimate is not installed next to {sys.executable}")

    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as cache:
        # Offline: a local folder needs no Hub, and an unreachable network must not time retries.
        # Own cache folder: a stale entry from the user's cache must neither answer nor be overwritten.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": cache}
        make_config(folder)
        dtypes = ["--dtypes", "float32", "float16"]
        commands = {
            "import torch": [sys.executable, "-c", "import torch"],
            FLOOR: [sys.executable, "-c", "import transformers.models.bert.modeling_bert"],
            COLD: [x_estimate, folder, *dtypes, "--no-cache"],
            CACHED: [x_estimate, folder, *dtypes],
        }
        if version("accelerate") == "not installed":
            print("accelerate is not installed: its row is left out (nox -s bench installs it)")
        else:
            commands[ACC] = [sys.executable, "-c", ACCELERATE, folder, *dtypes]

        def checked(name: str) -> float:
            elapsed, out = run(name, commands[name], env)
            total = float32_total(out)
            if total != EXPECTED[name]:
                sys.exit(f"{name}: float32 Total Size {total}, expected {EXPECTED[name]}")
            return elapsed

        first = {name: checked(name) for name in EXPECTED if name in commands}
        for name, argv in commands.items():  # the others were warmed up by their check
            if name not in first:
                first[name] = run(name, argv, env)[0]

        # Round-robin rather than one command after another, so drift in machine load hits all alike.
        # --quick times each command once: its checked first run (cold-ish), except the cached row's, which
        # missed the cache and filled it; its second run answers from the cache, as the row means.
        times: dict[str, list[float]] = {name: [first[name]] if args.quick else [] for name in commands}
        if args.quick:
            times[CACHED] = [checked(CACHED)]
        for _ in range(0 if args.quick else args.repeat):
            for name, argv in commands.items():
                times[name].append(run(name, argv, env)[0])

    medians = {name: statistics.median(ts) for name, ts in times.items()}
    base = medians["import torch"]
    print(f"\nbert-base-cased config, local folder, --dtypes float32 float16; median of {args.repeat} runs")
    print("| command | median wall s | ratio to `import torch` |")
    print("|---|---|---|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} | {seconds / base:.2f} |")
    if ACC in medians:
        cold, cached = medians[COLD] / medians[ACC], medians[CACHED] / medians[ACC]
        print(f"x-estimate / Accelerate: {cold:.2f} (--no-cache), {cached:.2f} (cached)")
    # Building a transformers model needs its module: nothing that builds the class starts faster.
    print(f"x-estimate --no-cache beyond importing the model's module: {medians[COLD] - medians[FLOOR]:+.2f} s")
    # Judged on the first estimate: the cache only helps a config already seen.
    ratio = medians[COLD] / base
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"target: x-estimate --no-cache <= {TARGET}x `import torch`: {verdict} ({ratio:.2f}x)")
    simulated_8b(x_estimate, args.repeat, quick=args.quick)


def simulated_8b(x_estimate: str, repeat: int, *, quick: bool = False) -> None:
    """Time the simulated Llama-3.1-8B estimate at 8k tokens against its import floor."""
    floor, formula, simulated, acc = (
        "import modeling_llama", "x-estimate --method formula", "x-estimate (simulated, cuda)", ACC,
    )  # fmt: skip
    on_cpu = "x-estimate (simulated, --device cpu)"
    inputs = [str(LLAMA_8B), "--seq-len", "8192", "--fits", "80GiB", "--no-cache"]
    commands = {
        floor: [sys.executable, "-c", "import transformers.models.llama.modeling_llama"],
        formula: [x_estimate, *inputs, "--method", "formula"],
        simulated: [x_estimate, *inputs],
        on_cpu: [x_estimate, *inputs, "--device", "cpu"],
    }
    if version("accelerate") != "not installed":
        commands[acc] = [sys.executable, "-c", ACCELERATE, str(LLAMA_8B), "--dtypes", "float32"]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": cache}
        first = {simulated: run(simulated, commands[simulated], env)}  # warm-up, and the answer is checked
        out = first[simulated][1]
        if "Training peak (adamw, simulated)" not in out or "Reserved (CUDA)" not in out:
            sys.exit(f"{simulated}: no simulated training figures in its output:\n{out}")
        for name, argv in commands.items():
            if name != simulated:
                first[name] = run(name, argv, env)
        times: dict[str, list[float]] = {name: [first[name][0]] if quick else [] for name in commands}
        for _ in range(0 if quick else repeat):
            for name, argv in commands.items():
                times[name].append(run(name, argv, env)[0])
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\nllama-3.1-8b config, --seq-len 8192 --fits 80GiB, all five rows; median of {repeat} runs")
    print("| command | median wall s | ratio to importing modeling_llama |")
    print("|---|---|---|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} | {seconds / medians[floor]:.2f} |")
    if acc in medians:
        print(f"simulated / Accelerate: {medians[simulated] / medians[acc]:.2f}")
    print(f"--device cpu / cuda: {medians[on_cpu] / medians[simulated]:.2f}")
    ratio = medians[simulated] / medians[floor]
    verdict = "met" if ratio <= SIM_TARGET else "NOT met"
    print(f"target: simulated estimate <= {SIM_TARGET}x importing modeling_llama: {verdict} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
