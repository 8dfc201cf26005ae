"""Trains a tiny Llama built from a config; the launch config decides the strategy.

    train_llama.py OUT PROJECT

Rank 0 reports the gathered weights, the strategy, the sharded units and what save_state and
save_model wrote; plain ``python train_llama.py`` is the single-process reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from x_runtime import Accelerator, DataLoaderConfiguration


def tiny_llama() -> LlamaForCausalLM:
    """A 3-block Llama of 64 tokens, seeded (also the model of planned_run.py)."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def main() -> None:
    out, project = Path(sys.argv[1]), Path(sys.argv[2])
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    model = tiny_llama()
    tokens = torch.randint(0, 64, (16, 12), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _epoch in range(3):
        for (batch,) in loader:
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    accelerator.save_state(project / "ckpt")
    accelerator.save_model(model, project / "final")
    weights = accelerator.get_state_dict(model)
    inner = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        report = {
            "type": str(accelerator.distributed_type),
            "world": accelerator.num_processes,
            "losses": losses,
            "units": sorted(n for n, m in inner.named_modules() if type(m).__name__.startswith("FSDP")),
            "checkpoint": sorted(p.name for p in (project / "ckpt").iterdir()),
            "weights": {k: v.flatten().tolist() for k, v in weights.items()},
        }
        (out / "report.json").write_text(json.dumps(report))
    accelerator.end_training()


if __name__ == "__main__":
    main()
