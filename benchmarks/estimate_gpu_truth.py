"""Measured GPU training-step peaks beside x-estimate's simulated ones: the ground truth for its CUDA plan.

    python benchmarks/estimate_gpu_truth.py [--out FILE.json]

x-estimate simulates a training step on fake tensors with the CPU's kernels. What a capacity
planner needs is the GPU's figure: flash / memory-efficient attention instead of the math path,
autocast's casts, and the caching allocator's rounding and reserve. This script runs the loop users
write (``outputs = model(**batch); loss = outputs.loss; loss.backward(); optimizer.step();
optimizer.zero_grad()``) on CUDA for small transformers models built from configs, and records for
the second step (optimizer state already allocated) ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` (whole-process figures: weights, gradients and optimizer state included, and
what was held before the step recorded beside them), next to x-estimate's simulated peak for the same
model, batch, sequence length and precision (``x-estimate FOLDER --json``). Nothing is asserted:
the table and the JSON are data for x-estimate's CUDA simulation to be checked against.

Without a CUDA device it says so and exits 0. On an H200 the whole run takes under a minute.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MIB = 1 << 20

# (name, config class, config kwargs): small members of the families issue 32 names.
MODELS = (
    (
        "llama-20M",
        "LlamaConfig",
        dict(
            vocab_size=32000,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            architectures=["LlamaForCausalLM"],
        ),
    ),
    (
        "gpt2-6x512",
        "GPT2Config",
        dict(n_layer=6, n_embd=512, n_head=8, n_positions=4096, architectures=["GPT2LMHeadModel"]),
    ),
)
# (precision as x-estimate names it, params dtype, autocast dtype)
PRECISIONS = (("fp32", "float32", None), ("mixed-bf16", "float32", "bfloat16"), ("bf16", "bfloat16", None))
SHAPES = ((8, 128), (2, 2048))  # (batch, seq): short sequences, and long ones where attention's S^2 shows
ATTENTION = ("sdpa", "eager")


def measure_step(folder: Path, *, batch: int, seq: int, precision: tuple, attention: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    _, params_dtype, autocast_dtype = precision
    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attention, dtype=getattr(torch, params_dtype)
    ).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
    batch_dict = {"input_ids": ids, "labels": ids}

    def step() -> None:
        with torch.autocast(
            "cuda", dtype=getattr(torch, autocast_dtype or "bfloat16"), enabled=autocast_dtype is not None
        ):
            outputs = model(**batch_dict)
            loss = outputs.loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        del outputs, loss

    step()  # optimizer state allocated; kernels chosen and warmed
    torch.cuda.synchronize()
    before_alloc, before_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    result = {
        "params": sum(p.numel() for p in model.parameters()),
        "held_before_step": before_alloc,
        "reserved_before_step": before_reserved,
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
    }
    return result  # model and optimizer are freed here; the caller empties the cache


def estimate(folder: Path, *, batch: int, seq: int, precision: str, attention: str) -> dict:
    dtype = {"fp32": "float32", "mixed-bf16": "bfloat16", "bf16": "bfloat16"}[precision]
    command = [
        sys.executable, "-m", "x_estimate", str(folder), "--dtypes", dtype, "--seq-len", str(seq),
        "--batch-size", str(batch), "--precision", precision, "--attn-implementation", attention, "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    training = json.loads(done.stdout)["rows"][0]["training"]
    return {
        "peak_bytes": training.get("peak_bytes"),
        "total": training.get("total"),
        "phase": training.get("peak_phase"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write every row as JSON here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("estimate_gpu_truth: no CUDA device here: nothing measured")
        return 0
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name(0)}")
    rows = []
    cases = [
        (name, batch, seq, precision, attention)
        for name, _, _ in MODELS
        for batch, seq in SHAPES
        for precision in PRECISIONS
        for attention in ATTENTION
    ]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(8) as pool:
        for name, config_class, kwargs in MODELS:
            getattr(transformers, config_class)(**kwargs).save_pretrained(Path(tmp) / name)
        # The simulations run on the CPU in other processes while the GPU steps run here.
        simulated = {
            case: pool.submit(
                estimate, Path(tmp) / case[0], batch=case[1], seq=case[2], precision=case[3][0], attention=case[4]
            )
            for case in cases
        }
        for case in cases:
            name, batch, seq, precision, attention = case
            row = {"model": name, "batch": batch, "seq": seq, "precision": precision[0], "attention": attention}
            try:
                row["measured"] = measure_step(
                    Path(tmp) / name, batch=batch, seq=seq, precision=precision, attention=attention
                )
            except Exception as error:  # one failing case must not hide the others
                row["measured"] = {"error": f"{type(error).__name__}: {error}"[:300]}
            torch.cuda.empty_cache()
            rows.append(row)
            print(line({**row, "x_estimate": {}}), flush=True)  # shown even if the simulations run out of time
        print("with x-estimate's simulated peaks:")
        for row, case in zip(rows, cases, strict=True):
            row["x_estimate"] = simulated[case].result()
            print(line(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


def line(row: dict) -> str:
    measured, simulated = row["measured"], row["x_estimate"]
    head = f"{row['model']:<11} b{row['batch']:<2} s{row['seq']:<5} {row['precision']:<10} {row['attention']:<5}"
    if "error" in measured:
        return f"{head} measured: {measured['error']}"
    step_peak = measured["peak_allocated"]
    text = f"{head} GPU peak allocated {step_peak / MIB:9.1f} MiB, reserved {measured['peak_reserved'] / MIB:9.1f} MiB"
    if simulated.get("peak_bytes"):
        text += (
            f" | x-estimate {simulated['peak_bytes'] / MIB:9.1f} MiB ({simulated['peak_bytes'] / step_peak - 1:+.1%})"
        )
    elif "error" in simulated:
        text += f" | x-estimate: {simulated['error']}"
    return text


if __name__ == "__main__":
    sys.exit(main())
