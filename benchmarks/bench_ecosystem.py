"""transformers' Trainer and from_pretrained(device_map=...) on x serving `accelerate` vs the real Accelerate.

    nox -s bench            # or: python benchmarks/bench_ecosystem.py [--repeat 3] [--steps 64] [--quick]

Two rows for each of two questions a Trainer user asks before switching:

- Trainer steps/s, 1 process and 2 (torchrun, gloo): the same Trainer script (a 4-layer Llama of
  2.4M parameters, batch 8 x 64 tokens, AdamW), timed by Trainer's own ``train_runtime`` (the loop,
  without imports and setup), the real Accelerate against x serving the import
  (``X_PROVIDE_ACCELERATE=1``). There is no plain-PyTorch row: Trainer cannot run without an
  accelerate, so the real Accelerate is the baseline.
- ``from_pretrained(device_map="auto", max_memory={"cpu": "20MB"}, offload_folder=...)`` of a 48 MiB
  checkpoint (the rest goes to disk): load time, and bytes written to the offload folder (both map
  the safetensors in place: nothing is expected to be written).

Every job runs in a fresh process (ecosystem_workers/worker.py), the two variants alternating
(A B A B ...) so load drift hits both alike, --repeat times. Before a time is trusted the outputs are
checked: both variants log the same losses, and load the same logits. Ratios are x / Accelerate:
steps/s higher is better, load time lower is better; the target is parity (0.98 and 1.02);
reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WORKER = Path(__file__).parent / "ecosystem_workers" / "worker.py"
TARGET_STEPS = 0.98  # x / Accelerate, steps per second: at least
TARGET_LOAD = 1.02  # x / Accelerate, seconds: at most
VARIANTS = ("accelerate", "x")


def _env(variant: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_PROVIDE", "ACCELERATE_"))}
    environ.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if variant == "x":
        environ["X_PROVIDE_ACCELERATE"] = "1"
    return environ


def _job(variant: str, argv: list[str], out: Path, processes: int = 1) -> dict[str, Any]:
    launcher = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    if processes > 1:
        launcher.append(f"--nproc_per_node={processes}")
    done = subprocess.run(
        [*launcher, str(WORKER), *argv], capture_output=True, text=True, env=_env(variant), timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"{variant} job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    if result["served"] != (variant == "x"):
        raise SystemExit(f"the {variant} job imported the wrong accelerate (served: {result['served']})")
    return result


def _checkpoint(folder: Path) -> Path:
    code = (
        "import torch, sys\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "torch.manual_seed(0)\n"
        "c = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,"
        " num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128)\n"
        "LlamaForCausalLM(c).save_pretrained(sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, env=_env("accelerate"), timeout=300)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="one repeat, 16 steps: a smoke run")
    args, _ = parser.parse_known_args()
    repeat, steps = (1, 16) if args.quick else (args.repeat, args.steps)
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "accelerate", "x-runtime")}
    print("bench_ecosystem:", ", ".join(f"{k} {v}" for k, v in versions.items()), f"| {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for processes in (1, 2):
            rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
            losses = {}
            for round_ in range(repeat):
                for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                    out = root / f"trainer-{processes}-{variant}-{round_}.json"
                    result = _job(variant, ["trainer", str(steps), str(out)], out, processes)
                    rates[variant].append(result["steps"] / result["seconds"])
                    losses[variant] = result["losses"]
            if losses["x"] != losses["accelerate"]:
                raise SystemExit(
                    f"Trainer on {processes} process(es): x logged {losses['x']}, Accelerate {losses['accelerate']}"
                )
            rows.append((f"Trainer steps/s, {processes} proc", rates, "steps/s", TARGET_STEPS, True))
        model = _checkpoint(root / "model")
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        written, logits = {}, {}
        for round_ in range(repeat):
            for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                out, offload = root / f"load-{variant}-{round_}.json", root / f"offload-{variant}-{round_}"
                result = _job(variant, ["load", str(model), str(offload), str(out)], out)
                times[variant].append(result["seconds"])
                written[variant], logits[variant] = result["written"], result["logits"]
        if logits["x"] != logits["accelerate"]:
            raise SystemExit("from_pretrained(device_map='auto'): x's logits differ from Accelerate's")
        rows.append(("from_pretrained auto->disk, load", times, "s", TARGET_LOAD, False))
    print(f"{'row':<36} {'Accelerate':>12} {'x':>12} {'x/Acc':>7}  target")
    for label, values, unit, target, higher in rows:
        theirs, ours = statistics.median(values["accelerate"]), statistics.median(values["x"])
        ratio = ours / theirs
        met = ratio >= target if higher else ratio <= target
        print(
            f"{label:<36} {theirs:>9.2f} {unit:<2} {ours:>9.2f} {unit:<2} {ratio:>6.2f}x  {'met' if met else 'MISSED'}"
        )
    print(f"{'bytes written to the offload folder':<36} {written['accelerate']:>12} {written['x']:>12}")


if __name__ == "__main__":
    main()
