"""Generate text with a model that does not fit in its RAM budget: part in RAM, the rest read from disk.

    python examples/offload_generate.py [--layers 8] [--cpu-budget 64MiB] [--folder runs/offload-example]

Builds a small Llama-style model from a config (random weights: nothing is downloaded), saves it
as a sharded safetensors checkpoint, then loads it the big-model way: the skeleton on the meta
device, a device map planned within the CPU budget (the rest goes to "disk"), and the checkpoint
streamed in. Disk-mapped layers are read in place from the checkpoint during each forward, the
next layer's pages fetched by a background thread meanwhile. Greedy generation must give the same
tokens as the same model held fully in memory; the script checks it and prints both timings.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from x_bigmodel import init_empty_weights, load_checkpoint_and_dispatch
from x_common import format_size, parse_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--cpu-budget", default="64MiB", help="RAM the weights may use (default: %(default)s)")
    parser.add_argument("--folder", type=Path, default=Path("runs/offload-example"))
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
    print(f"model: {args.layers} layers, {format_size(size)} of weights; RAM budget {args.cpu_budget}")

    with init_empty_weights():
        model = LlamaForCausalLM(config).eval()
    model = load_checkpoint_and_dispatch(
        model,
        checkpoint,
        device_map="auto",
        max_memory={"cpu": parse_size(args.cpu_budget), "disk": "10GiB"},
        no_split_module_classes=model._no_split_modules,
        offload_folder=args.folder / "offload",
        show_progress=False,
    )
    where = {}
    for name, device in model.hf_device_map.items():
        where.setdefault(str(device), []).append(name)
    for device, names in where.items():
        print(f"  {device:5} {len(names):3} entries: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}")
    offloaded = list((args.folder / "offload").glob("*.safetensors"))
    print(f"weight files written to the offload folder: {len(offloaded)} (disk layers are read from the checkpoint)")

    prompt = torch.tensor([[1, 306, 4658, 278, 6593, 310]])
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
