"""transformers' Trainer on x serving ``accelerate`` (run with ``X_PROVIDE_ACCELERATE=1``): a tiny
Llama from its config, 4 x 64 tokens per step, ``argv[2]`` steps, output in ``argv[1]``. The
Trainer drops the model's outputs before backward; the memory guard must say so and match."""

from __future__ import annotations

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from transformers.utils import logging


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 8000, (64,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


logging.set_verbosity_error()
config = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=8000)  # fmt: skip
arguments = TrainingArguments(
    output_dir=sys.argv[1], per_device_train_batch_size=4, max_steps=int(sys.argv[2]), report_to=[], use_cpu=True,
    logging_steps=100_000, save_strategy="no", disable_tqdm=True,
)  # fmt: skip
Trainer(model=LlamaForCausalLM(config), args=arguments, train_dataset=Tokens()).train()
