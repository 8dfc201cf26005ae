"""A transformers Trainer run on x serving accelerate, for x's strengths under Trainer (test_trainer_on_x.py).

    x-launch --provide-accelerate --num_processes 2 --cpu trainer_job.py OUT [--pace S] [--progress FILE]
        [--hang-rank R --hang-step N] [--preemptible] [--complete] [--resume]

A tiny Llama (dropout on, so the global random stream matters) trains 24 steps on 2 processes,
checkpointing every 6. ``--progress`` has rank 0 write the step it finished; ``--pace`` sleeps
after each step (so a test can act mid-run); ``--hang-rank`` makes one rank sleep inside step N
(the stall watchdog's case); ``--preemptible`` adds x's PreemptionCallback; ``--complete`` adds
CompleteCheckpoints; ``--resume`` resumes from the latest checkpoint in OUT (with ``--complete``, the
newest complete one). Rank 0 writes OUT/final.safetensors and OUT/stopped_at.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Pace(TrainerCallback):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = int(os.environ.get("RANK", "0"))

    def on_step_end(self, args, state, control, **kwargs):
        if self.args.hang_rank == self.rank and state.global_step == self.args.hang_step:
            time.sleep(600)  # the stuck rank
        if self.args.progress and self.rank == 0:
            Path(self.args.progress).write_text(str(state.global_step))
        time.sleep(self.args.pace)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--progress", default=None)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=-1)
    parser.add_argument("--preemptible", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument(
        "--complete", action="store_true", help="x's CompleteCheckpoints; resume from the newest complete one"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_dropout=0.1,
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 128, (16,), generator=generator)} for _ in range(96)]
    for item in data:
        item["labels"] = item["input_ids"]
    training = TrainingArguments(
        output_dir=str(args.out),
        per_device_train_batch_size=2,
        max_steps=24,
        save_steps=6,
        logging_steps=6,
        report_to=[],
        seed=42,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=data)
    trainer.add_callback(Pace(args))
    preemption = None
    if args.preemptible:
        from x_runtime.integrations.transformers import PreemptionCallback

        preemption = PreemptionCallback()
        trainer.add_callback(preemption)
    resume = None
    if args.resume:
        from x_runtime.integrations.transformers import last_complete_checkpoint

        resume = last_complete_checkpoint(args.out) if args.complete else get_last_checkpoint(str(args.out))
    if args.complete:
        from x_runtime.integrations.transformers import CompleteCheckpoints

        trainer.add_callback(CompleteCheckpoints())
    trainer.train(resume_from_checkpoint=resume)
    if int(os.environ.get("RANK", "0")) == 0:
        state = {k: v.detach().contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(state, str(args.out / "final.safetensors"))
        stopped = preemption.stopped_at if preemption is not None else None
        (args.out / "stopped_at").write_text("" if stopped is None else str(stopped))


if __name__ == "__main__":
    main()
