"""Prepared dataloaders on real ranks: every scenario of test_data_loader.py in one launch.

Run under torchrun (gloo, CPU) or as a plain script for one process. Each rank reports what it
saw as plain lists; the test compares them with the one-process global order.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from _helpers import report
from torch.utils.data import DataLoader, Dataset, IterableDataset

from x_runtime.data.gradient_state import GradientState
from x_runtime.data.loader.prepare import prepare_data_loader, skip_first_batches


class Indexed(Dataset):
    """Sample i is ``{"idx": i, "feat": [i, i]}``: nested batches, values that name their sample."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        return {"idx": torch.tensor(index), "feat": torch.full((2,), float(index))}


class Stream(IterableDataset):
    def __init__(self, size: int) -> None:
        self.size = size
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        for index in range(self.size):
            yield {"idx": torch.tensor(index), "feat": torch.full((2,), float(index))}


def ids(batch: dict) -> list[int]:
    # The two fields must stay aligned through slicing, padding and dispatch.
    assert torch.equal(batch["feat"][:, 0].long(), batch["idx"]), batch
    assert batch["feat"].shape == (len(batch["idx"]), 2)
    return batch["idx"].tolist()


def walk(loader) -> dict:
    batches, ends = [], []
    for batch in loader:
        batches.append(ids(batch))
        ends.append(loader.end_of_dataloader)
    return {"batches": batches, "ends": ends, "remainder": loader.remainder, "len": len(loader)}


def grid(processes: int, rank: int) -> dict:
    results = {}
    for size in (10, 12):
        for split, batch_size in ((False, 2), (True, 6)):
            for even in (True, False):
                for drop_last in (False, True):
                    for kind in ("map", "iterable", "dispatch-iterable", "dispatch-map"):
                        dataset = Stream(size) if "iterable" in kind else Indexed(size)
                        loader = prepare_data_loader(
                            DataLoader(dataset, batch_size=batch_size, drop_last=drop_last),
                            num_processes=processes,
                            process_index=rank,
                            split_batches=split,
                            even_batches=even,
                            dispatch_batches=kind.startswith("dispatch"),
                        )
                        results[f"{kind}/{size}/{int(split)}/{int(even)}/{int(drop_last)}"] = walk(loader)
    return results


def shuffled(processes: int, rank: int) -> dict:
    torch.manual_seed(1234 + rank)  # only rank 0's draw may count
    loader = prepare_data_loader(
        DataLoader(Indexed(10), batch_size=2, shuffle=True),
        num_processes=processes,
        process_index=rank,
        use_seedable_sampler=True,
    )
    epochs = [walk(loader)["batches"], walk(loader)["batches"]]
    loader.set_epoch(0)
    again = walk(loader)["batches"]
    return {"seed": loader.seed, "epochs": epochs, "again": again, "epoch_after": loader.epoch}


def bookkeeping(processes: int, rank: int) -> dict:
    out = {}
    for kind in ("map", "dispatch-iterable"):
        state = GradientState()
        dataset = Stream(10) if "iterable" in kind else Indexed(10)
        loader = prepare_data_loader(
            DataLoader(dataset, batch_size=2), num_processes=processes, process_index=rank, gradient_state=state
        )
        seen = []
        for _ in loader:
            seen.append([state.active_dataloader is loader, state.end_of_dataloader, state.remainder])
        after = state.in_dataloader
        for index, _ in enumerate(loader):
            if index == 1:
                inside = state.active_dataloader is loader
                break
        out[kind] = {
            "seen": seen,
            "after": after,
            "inside_before_break": inside,
            "after_break": state.in_dataloader,
            "end_after_break": loader.end_of_dataloader,
        }
        if "iterable" in kind:
            out[kind]["dataset_epochs"] = dataset.epochs
    return out


def resumed(processes: int, rank: int) -> dict:
    def fresh(seed: int, **kwargs):
        torch.manual_seed(seed)
        return prepare_data_loader(
            DataLoader(Indexed(14), batch_size=2, shuffle=True),
            num_processes=processes,
            process_index=rank,
            use_seedable_sampler=True,
            **kwargs,
        )

    first = fresh(7)
    epoch0 = walk(first)["batches"]
    partial = []
    for batch in first:  # epoch 1, stopped after two batches
        partial.append(ids(batch))
        if len(partial) == 2:
            break
    state = first.state_dict()
    after_break_epoch = first.epoch

    restarted = fresh(99)  # another seed: only load_state_dict can bring the order back
    restarted.load_state_dict(state)
    rest = walk(skip_first_batches(restarted, state["batches_yielded"]))["batches"]
    following = walk(restarted)["batches"]

    stateful = fresh(99, use_stateful_dataloader=True)
    stateful.load_state_dict(state)
    stateful_len = len(stateful)
    stateful_rest = walk(stateful)["batches"]
    stateful_following = walk(stateful)["batches"]

    reference = prepare_data_loader(
        DataLoader(Indexed(14), batch_size=2, shuffle=True),
        num_processes=processes,
        process_index=rank,
        use_seedable_sampler=True,
        data_seed=state["seed"],
    )
    reference_epochs = [walk(reference)["batches"] for _ in range(3)]

    stream = prepare_data_loader(DataLoader(Stream(10), batch_size=2), num_processes=processes, process_index=rank)
    for index, _ in enumerate(stream):
        if index == 0:
            break
    stream_state = stream.state_dict()
    stream_rest = walk(skip_first_batches(stream, stream_state["batches_yielded"]))["batches"]
    return {
        "state": state,
        "after_break_epoch": after_break_epoch,
        "epoch0": epoch0,
        "partial": partial,
        "rest": rest,
        "following": following,
        "stateful_len": stateful_len,
        "stateful_rest": stateful_rest,
        "stateful_following": stateful_following,
        "reference_epochs": reference_epochs,
        "stream_state": stream_state,
        "stream_rest": stream_rest,
    }


def main() -> None:
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    processes = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    found = {
        "grid": grid(processes, rank),
        "shuffled": shuffled(processes, rank),
        "bookkeeping": bookkeeping(processes, rank),
        "resumed": resumed(processes, rank),
    }
    report(found, sys.argv[1])
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
