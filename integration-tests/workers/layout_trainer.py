"""transformers' Trainer with ``TrainingArguments(parallelism_config=...)``, x serving ``accelerate``.

    x-launch --provide-accelerate --cpu --num_processes 4 layout_trainer.py OUT --layout 1,2,2

A tiny Llama (no dropout), 3 AdamW steps on a global batch of 8 (each data parallel rank 8 / dp);
without ``--layout`` one plain process. Rank 0 writes ``OUT/final.safetensors`` (whole weights,
gathered through the accelerator) and ``OUT/report.json`` (the layout Trainer saw).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import ParallelismConfig
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

GLOBAL_BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--layout", help="dp_replicate,dp_shard,tp")
    args = parser.parse_args()
    config = None
    dp = 1
    if args.layout:
        replicate, shard, tp = (int(n) for n in args.layout.split(","))
        config = ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp)
        dp = replicate * shard
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 256, (16,), generator=generator)} for _ in range(GLOBAL_BATCH * 3)]
    for item in data:
        item["labels"] = item["input_ids"]
    training = TrainingArguments(
        output_dir=str(args.out),
        per_device_train_batch_size=GLOBAL_BATCH // dp,
        max_steps=3,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=42,
        use_cpu=True,
        disable_tqdm=True,
        parallelism_config=config,
    )
    trainer = Trainer(model=model, args=training, train_dataset=data)
    trainer.train()
    weights = trainer.accelerator.get_state_dict(trainer.model)
    if trainer.accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(args.out / "final.safetensors"))
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        pc = trainer.accelerator.parallelism_config
        report = {"losses": losses, "tp_size": trainer.get_tp_size(), "sizes": pc.to_json() if pc else None}
        (args.out / "report.json").write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
