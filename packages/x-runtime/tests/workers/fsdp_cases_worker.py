"""FSDP cases on 2 processes: refusals, bf16 with size-based units, and meta models on rank 1."""

from __future__ import annotations

import torch
from _helpers import rank, report
from sharded_worker import Net
from torch import nn

from x_runtime import Accelerator, FullyShardedDataParallelPlugin, set_seed


def refusal(**kwargs) -> str:
    try:
        accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(**kwargs))
        accelerator.prepare(Net())
    except ValueError as exc:
        return str(exc)
    return "accepted"


def bf16_size_units() -> dict:
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="size_based_wrap", min_num_params=1000, reshard_after_forward=False
    )
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=plugin)
    set_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net, opt = accelerator.prepare(net, opt)
    g = torch.Generator().manual_seed(rank())
    x = torch.randn(32, 6, generator=g)
    y = x.sum(1, keepdim=True)
    losses = []
    for _ in range(15):
        loss = nn.functional.mse_loss(net(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    inner = accelerator.unwrap_model(net)
    # Read before another forward: reshard_after_forward=False leaves bf16 gathered copies registered.
    param_dtype = str(next(inner.parameters()).dtype)
    return {
        "losses": [losses[0], losses[-1]],
        "output_dtype": str(net(x).dtype),
        "param_dtype": param_dtype,
        "units": sorted(n for n, m in inner.named_modules() if type(m).__name__.startswith("FSDP")),
    }


def meta_on_other_ranks() -> dict:
    plugin = FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(123)
    if accelerator.is_main_process:
        net = Net()
        original = {k: v.clone() for k, v in net.state_dict().items()}
    else:
        with torch.device("meta"):
            net = Net()
        original = {}
    net = accelerator.prepare(net)
    gathered = accelerator.get_state_dict(net)
    same = all(torch.equal(gathered[k], v) for k, v in original.items()) if original else None
    out = net(torch.ones(2, 6))
    return {"rank0_weights_everywhere": same, "finite_output": bool(torch.isfinite(out).all())}


def main() -> None:
    data = {
        "offload": refusal(cpu_offload=True),
        "unknown_class": refusal(transformer_cls_names_to_wrap=["Block", "MysteryLayer"]),
        "bf16": bf16_size_units(),
        "meta": meta_on_other_ranks(),
    }
    report(data)


if __name__ == "__main__":
    main()
