"""What the memory guard costs a training loop: its first steps, and each step after its line.

    nox -s bench          # or: python benchmarks/bench_memory_guard.py [--repeat 3] [--steps 60] [--quick]

The loop is a transformers Llama built from its config (hidden 256, 4 layers, vocab 32000; AdamW,
batch 8 x 128 tokens, ``outputs = model(**batch)``) on CPU, one thread per process. Four variants,
each in fresh processes, started one after another in a rotated order each repeat: plain PyTorch,
Accelerate 1.15, x with the guard off (``X_MEMORY_GUARD=0``) and x with it on; x with it on runs
first in each repeat, until ``--steps`` steps after its line, and the others as many steps, in a
rotated order. Each times every step. Reported:

- first steps: from step 1 to the end of the step the guard measured (its line), x with the guard
  on minus x with it off, in seconds and in steps of the plain loop. The guard's simulation runs
  in a process of its own, so on a machine with a free core step 1 does not wait for it; on this
  2-core machine the two share the cores, and the figure is what that costs;
- each later step: the median step time after the guard's line, as a ratio to plain PyTorch and
  to Accelerate; the target is x(guard on) / x(guard off) within the noise (at most 1.01): after
  its line the guard costs a forward a shape comparison, timed apart too (the hook alone, called
  in a loop), since whole steps of a shared machine move by more than that.

The numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("plain", "accelerate", "x-off", "x-on")
TARGET_LATER_STEP = 1.01  # x(guard on) / x(guard off) after the guard's line


def _worker(variant: str, steps: int, quick: bool) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    size = (
        dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, vocab_size=2000)
        if quick
        else dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, vocab_size=32000)
    )
    config = LlamaConfig(num_attention_heads=4, num_key_value_heads=4, **size)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    backward = None
    guard = None
    if variant == "accelerate":
        from accelerate import Accelerator as AccelerateAccelerator

        accelerator = AccelerateAccelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        backward = accelerator.backward
    elif variant.startswith("x"):
        from x_runtime import Accelerator

        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        backward = accelerator.backward
        guard = accelerator._memory_guard
    model.train()
    batch, seq = (4, 32) if quick else (8, 128)
    batches = [torch.randint(0, config.vocab_size, (batch, seq)) for _ in range(4)]
    times, measured_at = [], None
    # x with the guard on runs until ``steps`` steps after its line (at most 3000): when it comes
    # depends on the machine; the others then run as many steps as it did.
    step = 0
    while step < (3000 if variant == "x-on" and measured_at is None else (measured_at or 0) + steps):
        ids = batches[step % len(batches)]
        start = time.perf_counter()
        outputs = model(input_ids=ids, labels=ids)
        (backward or torch.Tensor.backward)(outputs.loss)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
        if measured_at is None and guard is not None and guard.report is not None:
            measured_at = step
        step += 1
    print(json.dumps({"times": times, "measured_at": measured_at}))


def _hook_cost(calls: int) -> float:
    """Seconds per forward the guard's hook takes once its line is said (a shape comparison, the OOM note)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from x_runtime.memory.guard import GuardOptions, MemoryGuard

    config = LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=1000)  # fmt: skip
    model = LlamaForCausalLM(config).train()
    guard = MemoryGuard(GuardOptions(device=torch.device("cpu"), precision="no", is_main=True, compare=True))
    guard.watch(model, torch.optim.AdamW(model.parameters()))
    # The state after its line: watching, the batch's shape simulated already.
    guard._stage, guard._plan, guard._simulated = "watching", "(not needed)", [(8, 128)]
    ids = torch.zeros(8, 128, dtype=torch.long)
    start = time.perf_counter()
    for _ in range(calls):
        guard._before_forward(model, (), {"input_ids": ids, "labels": ids})
    cost = (time.perf_counter() - start) / calls
    guard.close()
    return cost


def _run(variant: str, steps: int, quick: bool) -> dict:
    environ = dict(os.environ, OMP_NUM_THREADS="1", X_MEMORY_GUARD="1" if variant == "x-on" else "0")
    args = [sys.executable, __file__, "--worker", variant, "--steps", str(steps), *(["--quick"] if quick else [])]
    # (--steps: the guarded run's steps after its line; the others' steps in all)
    done = subprocess.run(args, capture_output=True, text=True, env=environ, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="a tiny model, 1 repeat (a smoke run)")
    parser.add_argument("--worker", choices=VARIANTS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.steps, args.quick)
        return
    repeat, steps = (1, 30) if args.quick else (args.repeat, args.steps)
    print(f"memory guard: {repeat} repeat(s), {steps} steps after the line; load {os.getloadavg()[0]:.1f}", flush=True)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    others = tuple(v for v in VARIANTS if v != "x-on")
    for index in range(repeat):
        on = _run("x-on", steps, args.quick)
        runs["x-on"].append(on)
        total = len(on["times"])
        for variant in others[index % 3 :] + others[: index % 3]:
            runs[variant].append(_run(variant, total, args.quick))
    first_costs, later = [], {v: [] for v in VARIANTS}
    for index in range(repeat):
        on, off = runs["x-on"][index], runs["x-off"][index]
        at = on["measured_at"]
        if at is None:
            print(f"repeat {index + 1}: the guard said no line in {steps} steps; raise --steps")
            continue
        first_costs.append((sum(on["times"][: at + 1]) - sum(off["times"][: at + 1]), at + 1))
        for variant in VARIANTS:
            later[variant].append(statistics.median(runs[variant][index]["times"][at + 1 :]))
    if not first_costs:
        return
    plain_step = statistics.median(later["plain"])
    cost = statistics.median(c for c, _ in first_costs)
    print(
        f"first steps: the guard's line came after step {', '.join(str(a) for _, a in first_costs)}; "
        f"its cost until then {cost:+.2f} s ({cost / plain_step:+.1f} plain steps of {plain_step * 1e3:.0f} ms)"
    )
    ratios = [on / off for on, off in zip(later["x-on"], later["x-off"], strict=True)]
    ratio = statistics.median(ratios)
    print("later steps (median ms; ratio to plain, to Accelerate):")
    for variant in VARIANTS:
        value = statistics.median(later[variant])
        acc = statistics.median(later["accelerate"])
        print(f"  {variant:10s} {value * 1e3:8.1f} ms  {value / plain_step:5.2f}  {value / acc:5.2f}")
    verdict = "meets" if ratio <= TARGET_LATER_STEP else "misses"
    print(f"guard on / guard off after its line: {ratio:.3f} ({verdict} the target <= {TARGET_LATER_STEP})")
    hook = _hook_cost(2_000 if args.quick else 20_000)
    print(f"the guard's hook after its line: {hook * 1e6:.1f} us per forward ({hook / plain_step:.1e} of a plain step)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
