"""Generate text with a model larger than the memory budget it is given: the rest is read from disk.

    python examples/big_inference.py [--layers 8] [--budget 64MiB] [--folder runs/big-inference]

Builds a small Llama-style model from a config (random weights: nothing is downloaded), saves it
as a sharded safetensors checkpoint, then loads it with ``x_bigmodel.from_pretrained``: the
skeleton on the meta device, a device map planned within the budget (on a machine with a GPU, half of it on GPU 0 and
half in RAM; otherwise all in RAM; the rest goes to "disk"), and the checkpoint streamed in. Disk-mapped layers are read in place from the checkpoint during each forward, the
next layer's pages fetched by a background thread meanwhile. Greedy generation must give the same
tokens as the same model held fully in memory; the script checks it and prints both timings.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from x_bigmodel import from_pretrained
from x_common import format_size, parse_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--budget", default="64MiB", help="memory the weights may use (default: %(default)s)")
    parser.add_argument("--folder", type=Path, default=Path("runs/big-inference"))
    args = parser.parse_args()

    config = LlamaConfig(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=8000,
        tie_word_embeddings=False,
    )
    checkpoint = args.folder / "checkpoint"
    torch.manual_seed(0)
    reference = LlamaForCausalLM(config).eval()
    reference.save_pretrained(checkpoint, max_shard_size="20MB")
    size = sum(p.numel() * p.element_size() for p in reference.parameters())
    budget = parse_size(args.budget)
    max_memory = {0: budget // 2, "cpu": budget // 2} if torch.cuda.is_available() else {"cpu": budget}
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    reference.to(device)
    print(f"model: {args.layers} layers, {format_size(size)} of weights; budget {args.budget}, running on {device}")

    # One call: the class from config.json, built on meta, tied, mapped within the budget, streamed in.
    model = from_pretrained(checkpoint, max_memory=max_memory, offload_folder=args.folder / "offload")
    where = {}
    for name, placed in model.hf_device_map.items():
        where.setdefault(str(placed), []).append(name)
    for placed, names in where.items():
        print(f"  {placed:5} {len(names):3} entries: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}")
    offloaded = list((args.folder / "offload").glob("*.safetensors"))
    print(f"weight files written to the offload folder: {len(offloaded)} (disk layers are read from the checkpoint)")

    prompt = torch.tensor([[1, 306, 4658, 278, 6593, 310]], device=device)
    with torch.no_grad():
        for warm_up in (reference, model):  # one-time costs (thread pools, allocator) out of the timings
            warm_up.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=0)
        start = time.perf_counter()
        want = reference.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        in_memory = time.perf_counter() - start
        start = time.perf_counter()
        got = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        offloaded_time = time.perf_counter() - start
    print(f"in memory:  {want[0].tolist()}  {in_memory:.2f} s")
    print(f"offloaded:  {got[0].tolist()}  {offloaded_time:.2f} s")
    if not torch.equal(want, got):
        raise SystemExit("offloaded generation differs from the model in memory")
    print("same tokens")


if __name__ == "__main__":
    main()
