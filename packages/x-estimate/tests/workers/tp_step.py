"""One real training step of a transformers model under tensor parallelism: torch's DTensor over gloo.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tp_step.py OUT CONFIG

The model's own TP plan (``model._tp_plan``) becomes torch's styles: ``colwise`` ColwiseParallel,
``rowwise`` RowwiseParallel, ``colwise_gather_output`` ColwiseParallel with a replicated (gathered)
output, ``embedding_rowwise`` RowwiseParallel of the embedding with replicated ids. One fp32 AdamW
step of 2 x 16 tokens runs; each rank then writes ``OUT/rank<RANK>.json`` with the bytes of its local
shards of the parameters, their gradients (before ``zero_grad``), the AdamW state (its step counters
too) and the buffers.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

OUT, CONFIG = Path(sys.argv[1]), sys.argv[2]


def local_bytes(tensors) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in tensors)


def main() -> None:
    import transformers

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("tp",))
    config = transformers.AutoConfig.from_pretrained(CONFIG)
    torch.manual_seed(0)
    model = getattr(transformers, config.architectures[0])(config)
    styles = {
        "colwise": ColwiseParallel(),
        "rowwise": RowwiseParallel(),
        "colwise_gather_output": ColwiseParallel(output_layouts=Replicate()),
        "embedding_rowwise": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    }
    names = [name for name, _ in model.named_modules()]
    plan = {}
    for pattern, style in model._tp_plan.items():
        regex = re.compile("^" + re.escape(pattern).replace(r"\*", r"[^.]+") + "$")
        plan.update({name: styles[style] for name in names if regex.match(name)})
    parallelize_module(model, mesh, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    found = {
        "weights": local_bytes(params),
        "gradients": local_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer_state": local_bytes(state),
        "buffers": local_bytes(list(model.buffers())),
        "embedding_gradient": local_bytes([model.get_input_embeddings().weight.grad]),
    }
    (OUT / f"rank{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
