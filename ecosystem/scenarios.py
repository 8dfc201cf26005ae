"""The scenarios: transformers' Trainer, TRL's SFT and DPO trainers, PEFT and from_pretrained device maps.

    python ecosystem/scenarios.py NAME OUT_DIR [--resume CHECKPOINT]

Each scenario is what a user of the library writes, on a tiny model built from its config and on
data made here (nothing downloaded), seeded as the libraries' examples seed. It writes
``OUT_DIR/result.json`` on rank 0: what the run produced that can be compared between the real
Accelerate and x serving it (losses as logged, evaluation losses, a digest of the final
weights, the files a checkpoint holds, device maps and outputs). The script never imports x:
whether ``accelerate`` is the real package or x's is decided by how it is started
(``X_PROVIDE_ACCELERATE=1``, ``x-launch --provide-accelerate``), as for any user.

Options through the environment, as a user's launcher would set them: ``BF16=1``, ``GA=N``
(gradient accumulation), ``FSDP=1`` (TrainingArguments' fsdp, FSDP2), ``FSDP_SHARDED=1`` (its
checkpoints sharded through torch.distributed.checkpoint), ``DEEPSPEED=2|3`` (a ZeRO stage, with
``DEEPSPEED_OPTIMIZER=1`` the config's own optimizer and scheduler), ``LOAD_AFTER_ARGS=1`` (the model
loaded from a checkpoint after TrainingArguments: partitioned as it loads under ZeRO-3), ``DEVICE=cuda``
with ``FP16=1`` (the GPU cases: the fp16 scaler, NCCL, device maps onto GPU 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

VOCAB = 128


def tiny_llama(**overrides: Any) -> Any:
    """A 2-layer Llama built from its config, seeded; ``overrides`` change the config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    settings: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "attention_dropout": 0.1,  # dropout draws from the global RNG: its stream is compared too
        "pad_token_id": 120,
        "eos_token_id": 121,
    }
    return LlamaForCausalLM(LlamaConfig(**(settings | overrides)))


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(120)} | {"<pad>": 120, "<eos>": 121, "<unk>": 122}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def sentences(count: int, length: int, seed: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    return [" ".join(f"w{int(i)}" for i in torch.randint(0, 120, (length,), generator=generator)) for _ in range(count)]


def digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's bytes, in name order: equal digests are equal weights, bit for bit."""
    if any(hasattr(p, "ds_id") for p in model.parameters()):  # ZeRO-3 partitions: gather them, every rank
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            return _digest(model)
    return _digest(model)


def _digest(model: torch.nn.Module) -> str:
    hashed = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if hasattr(tensor, "full_tensor"):  # a DTensor shard (FSDP2): every rank takes part in the gather
            tensor = tensor.full_tensor()
        hashed.update(name.encode())
        hashed.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return hashed.hexdigest()


def save_weights(model: torch.nn.Module, out: Path) -> None:
    """The final weights as ``OUT/weights.safetensors`` (rank 0), for cases compared to a tolerance."""
    from safetensors.torch import save_file

    full = {}
    for name, tensor in model.state_dict().items():
        if hasattr(tensor, "full_tensor"):  # a DTensor shard (FSDP2): every rank takes part in the gather
            tensor = tensor.full_tensor()
        full[name] = tensor.detach().to("cpu").contiguous().clone()
    if is_main():
        save_file(full, str(out / "weights.safetensors"))


def history(trainer: Any) -> dict[str, Any]:
    logs = trainer.state.log_history
    return {
        "losses": [round(entry["loss"], 7) for entry in logs if "loss" in entry],
        "eval_losses": [round(entry["eval_loss"], 7) for entry in logs if "eval_loss" in entry],
        "steps": trainer.state.global_step,
    }


def is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def common_args(out: Path) -> dict[str, Any]:
    return {
        "output_dir": str(out),
        "report_to": [],
        "seed": 42,
        "use_cpu": os.environ.get("DEVICE", "cpu") == "cpu",  # DEVICE=cuda: the GPU cases
        "bf16": os.environ.get("BF16") == "1",
        "fp16": os.environ.get("FP16") == "1",
        "gradient_accumulation_steps": int(os.environ.get("GA", "1")),
        "disable_tqdm": True,
    }


def deepspeed_args() -> dict[str, Any]:
    """``deepspeed=`` for TrainingArguments when DEEPSPEED names a ZeRO stage (DEEPSPEED_OPTIMIZER=1: the
    config builds the optimizer and scheduler, through DummyOptim/DummyScheduler)."""
    if not os.environ.get("DEEPSPEED"):
        return {}
    config: dict[str, Any] = {
        "zero_optimization": {"stage": int(os.environ["DEEPSPEED"])},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
    }
    if os.environ.get("DEEPSPEED_OPTIMIZER") == "1":
        config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}
        config["scheduler"] = {
            "type": "WarmupDecayLR",
            "params": {"warmup_num_steps": "auto", "total_num_steps": "auto"},
        }
    return {"deepspeed": config}


def trainer(out: Path, resume: str | None) -> dict[str, Any]:
    """Trainer: causal LM, evaluation every 8 steps (gather across ranks), checkpoints every 8, resume."""
    from transformers import Trainer, TrainingArguments

    # LOAD_AFTER_ARGS=1: the model is loaded once TrainingArguments exist, as scripts loading a checkpoint do;
    # under ZeRO-3 transformers then builds it partitioned (zero.Init) from the HfDeepSpeedConfig.
    load_after = os.environ.get("LOAD_AFTER_ARGS") == "1"
    source = out / f"model-rank{os.environ.get('RANK', '0')}"
    if load_after:
        tiny_llama().save_pretrained(source)
    else:
        model = tiny_llama()
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 120, (16,), generator=generator)} for _ in range(64)]
    for item in data:
        item["labels"] = item["input_ids"].clone()
    extra: dict[str, Any] = {}
    if os.environ.get("FSDP") == "1":
        fsdp_config = {"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
        if (
            os.environ.get("FSDP_SHARDED") == "1"
        ):  # checkpoints through torch.distributed.checkpoint, one shard per rank
            fsdp_config["state_dict_type"] = "SHARDED_STATE_DICT"
        extra = {"fsdp": "full_shard", "fsdp_config": fsdp_config}
    extra.update(deepspeed_args())
    args = TrainingArguments(
        **common_args(out),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        num_train_epochs=1,
        logging_steps=2,
        save_steps=8,
        eval_strategy="steps",
        eval_steps=8,
        **extra,
    )
    if load_after:
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(source)
    run = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:16])
    run.train(resume_from_checkpoint=resume)
    if os.environ.get("FSDP") == "1":
        save_weights(run.model, out)
    checkpoint = out / "checkpoint-8"
    files = sorted(p.name for p in checkpoint.iterdir()) if checkpoint.is_dir() else []
    strategy = str(getattr(run.accelerator.state.distributed_type, "value", run.accelerator.state.distributed_type))
    return {**history(run), "weights": digest(run.model), "checkpoint_files": files, "strategy": strategy}


def sft(out: Path, resume: str | None, *, peft: bool = False) -> dict[str, Any]:
    """TRL's SFTTrainer on text, with or without a LoRA ``peft_config``; the saved model is loaded back."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    config = None
    if peft:
        from peft import LoraConfig

        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = SFTConfig(
        **common_args(out),
        per_device_train_batch_size=4,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        max_length=16,
        learning_rate=1e-3,
    )
    run = SFTTrainer(
        model=tiny_llama(),
        args=args,
        train_dataset=Dataset.from_dict({"text": sentences(32, 12, 1)}),
        processing_class=tokenizer(),
        peft_config=config,
    )
    run.train()
    saved = out / "final"
    run.save_model(str(saved))
    result = {**history(run), "weights": digest(run.model), "saved_files": sorted(p.name for p in saved.iterdir())}
    if peft and is_main():
        from peft import PeftModel

        reloaded = PeftModel.from_pretrained(tiny_llama(), str(saved))
        ids = torch.arange(10).reshape(1, 10)
        reloaded.eval()
        run.model.eval()
        with torch.no_grad():
            result["reload_equal"] = bool(torch.equal(reloaded(ids).logits, run.model.to("cpu")(ids).logits))
    return result


def dpo(out: Path, resume: str | None) -> dict[str, Any]:
    """TRL's DPOTrainer with an explicit reference model (prepared for evaluation beside the policy)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    model = tiny_llama()
    reference = tiny_llama()
    reference.load_state_dict(model.state_dict())
    data = Dataset.from_dict(
        {"prompt": sentences(16, 6, 1), "chosen": sentences(16, 4, 2), "rejected": sentences(16, 4, 3)}
    )
    args = DPOConfig(
        **common_args(out),
        **deepspeed_args(),
        per_device_train_batch_size=4,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        max_length=16,
        learning_rate=1e-3,
    )
    run = DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=data, processing_class=tokenizer())
    run.train()
    return {**history(run), "weights": digest(run.model)}


def device_maps(out: Path, resume: str | None) -> dict[str, Any]:
    """``from_pretrained(device_map=...)``: strategies, budgets, a dict with disk entries, an offload folder."""
    from transformers import LlamaForCausalLM

    source = out / "model"
    tiny_llama(hidden_size=64, intermediate_size=128, num_hidden_layers=4, attention_dropout=0.0).save_pretrained(
        source
    )
    layers = {f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(4)}
    cases: dict[str, dict[str, Any]] = {
        "cpu": {"device_map": "cpu"},
        # 400KB holds the embedding and one layer beside the largest layer's reserve: the rest goes to disk.
        "auto_to_disk": {"device_map": "auto", "max_memory": {"cpu": "400KB"}, "offload_folder": str(out / "off1")},
        "auto": {"device_map": "auto"},
        "balanced": {"device_map": "balanced", "max_memory": {"cpu": "1GB"}},
        "sequential": {"device_map": "sequential"},
        "dict_with_disk": {
            "device_map": {
                "model.embed_tokens": "cpu",
                **layers,
                "model.norm": "cpu",
                "model.rotary_emb": "cpu",
                "lm_head": "cpu",
            },
            "offload_folder": str(out / "off2"),
        },
    }
    if os.environ.get("DEVICE") == "cuda":  # the GPU's cases: a budget on GPU 0, then CPU and disk
        cases = {
            "gpu": {"device_map": {"": 0}},
            "auto_gpu_cpu_disk": {
                "device_map": "auto",
                "max_memory": {0: "400KB", "cpu": "350KB"},  # GPU: embedding, layer 0; CPU: layer 1
                "offload_folder": str(out / "off3"),
            },
            "dict_gpu_disk": {
                "device_map": {"model.embed_tokens": 0, **layers, "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0},
                "offload_folder": str(out / "off4"),
            },
        }
    ids = torch.arange(12).reshape(1, 12)
    found: dict[str, Any] = {}
    for name, kwargs in cases.items():
        model = LlamaForCausalLM.from_pretrained(source, **kwargs)
        with torch.no_grad():
            logits = model(ids.to(model.device)).logits.float().cpu()
        folder = Path(kwargs.get("offload_folder", out / "none"))
        written = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
        found[name] = {
            "map": {key: str(value) for key, value in (getattr(model, "hf_device_map", None) or {}).items()},
            "logits": hashlib.sha256(logits.numpy().tobytes()).hexdigest(),
            "bytes_written": written,
        }
    return found


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "trainer": trainer,
    "sft": sft,
    "sft_lora": lambda out, resume: sft(out, resume, peft=True),
    "dpo": dpo,
    "device_maps": device_maps,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(SCENARIOS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--resume", default=None, help="a Trainer checkpoint folder to resume from")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = SCENARIOS[args.name](args.out, args.resume)
    import accelerate

    result["accelerate"] = type(accelerate).__name__  # "ServedModule" under x, "module" for the real one
    if is_main():
        (args.out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
