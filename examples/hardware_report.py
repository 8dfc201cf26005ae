"""What this machine offers a training job, and what a model needs of it.

    python examples/hardware_report.py [--layers 12]

Prints every device x can use with its free memory, the host RAM this process may use
(cgroup limit included), then sizes a Transformer built on the meta device (no memory is
allocated for its weights) in several dtypes and says where it fits.
"""

from __future__ import annotations

import argparse

import torch

from x_common import format_size, host_memory, list_devices, module_sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12, help="encoder and decoder layers of the sized model")
    args = parser.parse_args()

    print("Devices:")
    devices = list_devices()
    for device in devices:
        free = "unknown" if device.free_memory is None else format_size(device.free_memory)
        total = "unknown" if device.total_memory is None else format_size(device.total_memory)
        print(f"  {device.torch_device:8} {device.name:32} {free:>12} free of {total}")
    mem = host_memory()
    limit = f" (cgroup limit {format_size(mem.cgroup_limit)})" if mem.cgroup_limit else ""
    print(f"Host RAM usable by this process: {format_size(mem.total)}{limit}")

    with torch.device("meta"):
        model = torch.nn.Transformer(
            d_model=1024, nhead=16, num_encoder_layers=args.layers, num_decoder_layers=args.layers, batch_first=True
        )
    params = sum(p.numel() for p in model.parameters())
    print(f"\nTransformer, {args.layers}+{args.layers} layers, d_model 1024: {params:,} parameters")
    best = devices[0]
    for dtype in ("float32", "bfloat16", "int8", "int4"):
        need = module_sizes(model, dtype=dtype)[""]
        room = best.free_memory
        verdict = "?" if room is None else ("fits" if need <= room else "does not fit")
        print(f"  {dtype:9} {format_size(need):>11}  {verdict} on {best.torch_device}")


if __name__ == "__main__":
    main()
