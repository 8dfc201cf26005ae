"""Per-module sizes of a large meta-device model: x vs plain PyTorch vs Accelerate, one run.

    nox -s bench            # or: python benchmarks/bench_module_sizes.py [--layers 48] [--repeat 5]

The model is a decoder stack with an input embedding tied to its output head, as in most
language models. "plain PyTorch" is what one writes by hand: for every module, sum the bytes
of its parameters and buffers (shared tensors deduplicated per module). Reported: median time
of --repeat runs, ratios, and each tool's total and tied-head size, because a fast wrong
answer is no answer (the head must hold its weight wherever a device map puts it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from x_common import format_size, module_sizes


def build(layers: int, vocab: int = 32000, width: int = 1024) -> torch.nn.Module:
    with torch.device("meta"):
        blocks = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(width, 16, 4 * width, batch_first=True), num_layers=layers
        )
        model = torch.nn.ModuleDict(
            {
                "embed": torch.nn.Embedding(vocab, width),
                "blocks": blocks,
                "head": torch.nn.Linear(width, vocab, bias=False),
            }
        )
    model["head"].weight = model["embed"].weight
    return model


def plain_torch(model: torch.nn.Module) -> dict[str, int]:
    sizes = {}
    for name, module in model.named_modules():
        tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
        sizes[name] = sum(t.numel() * t.element_size() for t in tensors.values())
    return sizes


def timed(fn: Callable[[], dict[str, int]], repeat: int) -> tuple[float, int, int]:
    times, sizes = [], {}
    for _ in range(repeat):
        start = time.perf_counter()
        sizes = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), int(sizes[""]), int(sizes.get("head", 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (nox -s bench -- --quick)")
    args, _ = parser.parse_known_args()  # `nox -s bench -- ...` hands every script the same flags
    if args.quick:
        args.repeat = 1
    model = build(args.layers)
    true_total = sum(p.numel() * 4 for p in model.parameters())  # parameters() yields a tied weight once
    true_head = model["head"].weight.numel() * 4

    rows = [("plain PyTorch", *timed(lambda: plain_torch(model), args.repeat))]
    try:
        from accelerate.utils import compute_module_sizes
    except ImportError:
        print("accelerate is not installed: its column is left out (nox -s bench installs it)")
    else:
        rows.append(("Accelerate", *timed(lambda: compute_module_sizes(model), args.repeat)))
    rows.append(("x", *timed(lambda: module_sizes(model), args.repeat)))

    x_time = rows[-1][1]
    print(
        f"module sizes, {args.layers}-layer decoder on meta, tied embedding/head; true total {format_size(true_total)}"
    )
    print("| tool | median time | time / x's | total | total right | tied head | head right |")
    print("|---|---|---|---|---|---|---|")
    for tool, seconds, total, head in rows:
        print(
            f"| {tool} | {seconds * 1000:.1f} ms | {seconds / x_time:.2f} | {format_size(total)} | {total == true_total}"
            f" | {format_size(head)} | {head == true_head} |"
        )


if __name__ == "__main__":
    main()
