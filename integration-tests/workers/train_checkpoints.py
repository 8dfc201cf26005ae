"""Train with a checkpoint every few steps; optionally stall inside one save, or resume from the latest.

    x-launch [--num_processes N --cpu] train_checkpoints.py PROJECT_DIR OUT.safetensors
        [--resume | --resume-if-any] [--stall-in-save N --stall-marker PATH]
        [--die-at-step N --die-marker PATH]
        [--preemptible [--pace S] [--progress PATH]] [--dropout P]

Checkpoints are ``PROJECT_DIR/checkpoints/checkpoint_<n>`` (automatic naming), one every
``--save-every`` optimizer steps, so most of them fall in the middle of an epoch. The loader is
stateful (a resumed run continues at the next batch) and the inputs get random noise from torch's
global generator, so an exact resume needs the weights, AdamW's state, the loader position and
every rank's generator back.

``--stall-in-save N``: while ``checkpoint_N`` is being written (its hidden in-progress folder
already holds the weights and the optimizer), the main process writes its pid to
``--stall-marker`` and sleeps, so that a test can kill it there. ``--resume`` loads the latest
complete checkpoint with ``load_state()`` before training; ``--resume-if-any`` does so when
there is one (how a script restarted by ``x-launch --max_restarts`` picks up where it stopped).
``--die-at-step N``: rank 1 exits at once (code 17) after optimizer step N, the first time only
(``--die-marker`` records that it did). Rank 0 writes the final weights to OUT.
``--preemptible``: the documented loop, ``accelerator.preemption_requested`` read after every
step; when it is True every rank writes the step to ``PROJECT_DIR/preempted_rank<N>``, the
state is saved and the script ends without writing OUT. ``--pace S`` sleeps S seconds a step,
``--progress PATH`` has rank 0 write the step count there after each step (so a test signals
mid-run). ``--dropout P`` adds a dropout layer (the global generator again).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import Accelerator, DataLoaderConfiguration, ProjectConfiguration, set_seed


class Progress:
    """The step counter, saved with the checkpoint through ``register_for_checkpointing``."""

    def __init__(self, save_every: int, stall_in_save: int | None, marker: str | None) -> None:
        self.step = 0
        self.save_every = save_every
        self.stall_in_save = stall_in_save
        self.marker = marker

    def state_dict(self) -> dict[str, torch.Tensor]:
        # Called by the main process inside save_state, after the weights and the optimizer.
        if self.stall_in_save is not None and self.step // self.save_every - 1 == self.stall_in_save:
            tmp = Path(f"{self.marker}.tmp")
            tmp.write_text(str(os.getpid()))
            tmp.rename(self.marker)
            time.sleep(300)  # the test kills this process here
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.step = int(state["step"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("project_dir")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--resume-if-any", action="store_true")
    parser.add_argument("--die-at-step", type=int)
    parser.add_argument("--die-marker")
    parser.add_argument("--stall-in-save", type=int)
    parser.add_argument("--stall-marker")
    parser.add_argument("--preemptible", action="store_true")
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--progress")
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()

    accelerator = Accelerator(
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=3
        ),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
    )
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 12, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    dropout = [torch.nn.Dropout(args.dropout)] if args.dropout else []
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), *dropout, torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress(args.save_every, args.stall_in_save, args.stall_marker)
    accelerator.register_for_checkpointing(progress)

    folder = None
    if args.resume:
        folder = accelerator.load_state()
    elif args.resume_if_any:
        with contextlib.suppress(FileNotFoundError):  # the first start: nothing saved yet
            folder = accelerator.load_state()  # the latest complete checkpoint
    if folder is not None:
        # One write per line: the ranks share stdout, and print() writes the end of line separately.
        sys.stdout.write(
            f"rank {accelerator.process_index}: resumed from {Path(folder).name} at step {progress.step}\n"
        )
        sys.stdout.flush()
    preempted = False
    while loader.epoch < args.epochs and not preempted:
        for xb, labels in loader:
            noisy = xb + 0.1 * torch.randn_like(xb)
            loss = torch.nn.functional.cross_entropy(model(noisy), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % args.save_every == 0:
                accelerator.save_state()
            dies = args.die_at_step == progress.step and accelerator.process_index == 1
            if dies and not Path(args.die_marker).exists():
                Path(args.die_marker).write_text("died once")
                os._exit(17)  # as a crash: no clean-up, no exception to catch
            if args.progress and accelerator.is_main_process:
                Path(f"{args.progress}.tmp").write_text(str(progress.step))
                os.replace(f"{args.progress}.tmp", args.progress)
            time.sleep(args.pace)
            if args.preemptible and accelerator.preemption_requested:
                Path(args.project_dir).mkdir(parents=True, exist_ok=True)  # asked before the first save
                Path(args.project_dir, f"preempted_rank{accelerator.process_index}").write_text(str(progress.step))
                accelerator.save_state()
                preempted = True
                break
    if preempted:
        accelerator.print(f"preempted at step {progress.step}: saved")
        accelerator.end_training()
        return
    accelerator.print(f"trained {progress.step} steps")
    weights = accelerator.get_state_dict(model)
    accelerator.save({k: v.detach().contiguous() for k, v in weights.items()}, args.out, safe_serialization=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
