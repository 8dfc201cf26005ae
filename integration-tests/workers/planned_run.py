"""One training step under whatever launch config x-launch was given; rank 0 reports what ran.

    planned_run.py OUT

Reports the strategy, processes, precision, accumulation, the FSDP plugin's settings and which
modules were sharded as units, so a written config can be checked against the run it starts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from train_llama import tiny_llama

from x_runtime import Accelerator


def main() -> None:
    out = Path(sys.argv[1])
    accelerator = Accelerator()
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    batch = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(accelerator.process_index))
    with accelerator.accumulate(model), accelerator.autocast():
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    plugin = accelerator.state.fsdp_plugin
    inner = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        report = {
            "type": str(accelerator.distributed_type),
            "world": accelerator.num_processes,
            "mixed_precision": accelerator.mixed_precision,
            "accumulation": accelerator.gradient_accumulation_steps,
            "reshard_after_forward": getattr(plugin, "reshard_after_forward", None),
            "activation_checkpointing": getattr(plugin, "activation_checkpointing", None),
            "units": sorted({type(m).__name__ for m in inner.modules() if type(m).__name__.startswith("FSDP")}),
            "loss": loss.item(),
        }
        (out / "report.json").write_text(json.dumps(report))
    accelerator.end_training()


if __name__ == "__main__":
    main()
