"""One timed job of bench_ecosystem.py, in a fresh process: a Trainer run, or a from_pretrained load.

    python worker.py trainer STEPS OUT_JSON
    python worker.py load MODEL_DIR OFFLOAD_DIR OUT_JSON

Whether ``accelerate`` is the real package or x's is decided by the environment
(``X_PROVIDE_ACCELERATE``), as for a user. The result (written by rank 0) holds what the bench
reports and what it checks: Trainer's own ``train_runtime`` (the loop, without imports and
setup) with the losses, or the load time, the bytes written to the offload folder and a digest of
the logits.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch


def trainer(steps: int, out: Path) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    data = [{"input_ids": torch.randint(0, 1024, (64,), generator=generator)} for _ in range(steps * 8 * world)]
    for item in data:
        item["labels"] = item["input_ids"]
    args = TrainingArguments(
        output_dir=str(out.parent / "trainer-out"),
        per_device_train_batch_size=8,
        max_steps=steps,
        logging_steps=steps // 4,
        save_strategy="no",
        report_to=[],
        seed=42,
        use_cpu=True,
        disable_tqdm=True,
    )
    run = Trainer(model=model, args=args, train_dataset=data)
    metrics = run.train().metrics
    losses = [round(e["loss"], 6) for e in run.state.log_history if "loss" in e]
    return {"seconds": metrics["train_runtime"], "steps": steps, "losses": losses}


def load(model_dir: Path, offload: Path) -> dict:
    from transformers import LlamaForCausalLM

    started = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(
        model_dir, device_map="auto", max_memory={"cpu": "20MB"}, offload_folder=str(offload)
    )
    seconds = time.perf_counter() - started
    with torch.no_grad():
        logits = model(torch.arange(16).reshape(1, 16)).logits
    written = sum(p.stat().st_size for p in offload.rglob("*") if p.is_file()) if offload.is_dir() else 0
    placed = sorted({str(v) for v in model.hf_device_map.values()})
    return {
        "seconds": seconds,
        "written": written,
        "placed": placed,
        "logits": hashlib.sha256(logits.numpy().tobytes()).hexdigest(),
    }


def main() -> None:
    kind = sys.argv[1]
    if kind == "trainer":
        result, out = trainer(int(sys.argv[2]), Path(sys.argv[3])), Path(sys.argv[3])
    else:
        result, out = load(Path(sys.argv[2]), Path(sys.argv[3])), Path(sys.argv[4])
    import accelerate

    result["served"] = type(accelerate).__name__ == "ServedModule"
    if int(os.environ.get("RANK", "0")) == 0:
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
