"""A training loop as users write it, for the memory guard's tests: a tiny transformers model from
its config (or a plain module), AdamW, the Accelerator, ``outputs = model(**batch)`` kept through
the step. The guard's line goes to stderr; with ``--report`` the figures it compared go to a JSON file.

Options: ``--family`` llama, gpt2, bert or plain; ``--steps``; ``--accumulation``; ``--batch``/``--seq``;
from step ``--long-at`` on, batches of ``--long-seq`` tokens (a pre-hook registered after the guard's
prints ``forward of B x S`` when such a forward proceeds); ``--oom-at``: that step's forward fails
with an allocation failure (``--oom-after-report``: the first after the guard's line); ``--profile``: ``accelerator.profile()`` around the first steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch

from x_runtime import Accelerator


def _model(family: str) -> tuple[torch.nn.Module, int]:
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=8000)  # fmt: skip
        return LlamaForCausalLM(config), 8000
    if family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=10000)), 10000
    if family == "bert":
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                            vocab_size=9000)  # fmt: skip
        return BertForMaskedLM(config), 9000

    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 64)
            self.head = torch.nn.Linear(64, 1000)

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.head(self.embed(input_ids))
            return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}

    return Plain(), 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="llama")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--long-at", type=int, default=-1)
    parser.add_argument("--long-seq", type=int, default=512)
    parser.add_argument("--oom-at", type=int, default=-1)
    parser.add_argument("--oom-after-report", action="store_true", help="fail the first forward after the guard's line")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--until-reported", action="store_true", help="stop once the guard has said its line")
    parser.add_argument("--report")
    args = parser.parse_args()

    torch.manual_seed(0)
    model, vocab = _model(args.family)
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulation)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()

    def announce(module: torch.nn.Module, inputs: tuple, kwargs: dict) -> None:
        ids = kwargs["input_ids"]
        if ids.shape[1] == args.long_seq:
            print(f"forward of {ids.shape[0]} x {ids.shape[1]}", file=sys.stderr, flush=True)
        if oom_now[0]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")

    oom_now = [False]
    accelerator.unwrap_model(model).register_forward_pre_hook(announce, with_kwargs=True)
    guard = accelerator._memory_guard
    profiling = accelerator.profile() if args.profile else contextlib.nullcontext()
    outputs = None
    with profiling:
        for step in range(args.steps):
            if args.profile and step == 4:
                break
            reported = guard is not None and guard.report is not None
            oom_now[0] = step == args.oom_at or (args.oom_after_report and reported)
            seq = args.long_seq if 0 <= args.long_at <= step else args.seq
            ids = torch.randint(0, vocab, (args.batch, seq))
            with accelerator.accumulate(model):
                outputs = model(input_ids=ids, labels=ids)
                accelerator.backward(outputs["loss"])
                optimizer.step()
                optimizer.zero_grad()
            if args.until_reported and guard is not None and guard.report is not None:
                break
            time.sleep(0.05)  # a step of a real model is longer: give the plan's process the CPU
    if args.profile:
        for _ in range(args.steps):
            ids = torch.randint(0, vocab, (args.batch, args.seq))
            outputs = model(input_ids=ids, labels=ids)
            accelerator.backward(outputs["loss"])
            optimizer.step()
            optimizer.zero_grad()
            if guard is not None and guard.report is not None:
                break
    if args.report and accelerator.is_main_process:
        found: dict = {"guard": guard is not None}
        if guard is not None and guard.report is not None:
            measured, plan = guard.report
            found.update(measured=measured.allocated, baseline=measured.baseline, resident=measured.resident)
            found["planned"] = plan if isinstance(plan, str) else plan.peak
        with open(args.report, "w") as handle:
            json.dump(found, handle)


if __name__ == "__main__":
    main()
