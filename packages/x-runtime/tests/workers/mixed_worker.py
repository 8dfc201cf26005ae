"""Process helpers, triggers and two accelerators in one process, on every rank."""

from __future__ import annotations

import torch
from _helpers import report

from x_runtime import Accelerator


def main() -> None:
    first = Accelerator(cpu=True)
    second = Accelerator(cpu=True, gradient_accumulation_steps=3)
    rank, world = first.process_index, first.num_processes
    found: dict = {"rank": rank, "world": world, "second_steps": second.gradient_accumulation_steps}
    found["first_steps"] = first.gradient_accumulation_steps
    if not torch.cuda.is_available():
        # No cpu=True: on a machine without GPUs plain torchrun still means one multi-process job.
        plain = Accelerator()
        found["plain_world"], found["plain_type"] = plain.num_processes, plain.distributed_type

    with first.split_between_processes(list(range(7))) as share:
        found["share"] = share
    with first.split_between_processes(torch.arange(7), apply_padding=True) as share:
        found["padded"] = first.gather(share).tolist()
    with first.split_between_processes({"a": [1, 2, 3], "b": ["x", "y", "z"]}) as share:
        found["dict_share"] = share

    found["on_main"] = first.on_main_process(lambda: "ran")()
    found["on_last"] = first.on_last_process(lambda: "ran")()
    found["on_1"] = first.on_process(process_index=1)(lambda: "ran")()

    order = []
    with first.main_process_first():
        order.append(rank)
    found["reduce_sum"] = first.reduce(torch.tensor([rank + 1.0])).item()
    found["reduce_mean"] = first.reduce(torch.tensor([rank + 1.0]), reduction="mean").item()
    padded = first.pad_across_processes(torch.ones(rank + 1), pad_index=-1)
    found["pad"] = padded.tolist()

    if rank == world - 1:
        first.set_trigger()
    found["trigger"] = first.check_trigger()
    found["trigger_again"] = first.check_trigger()
    found["trigger_second"] = second.check_trigger()
    first.end_training()
    # After end_training a new accelerator in the same process trains over the same group.
    third = Accelerator(cpu=True)
    model = third.prepare(torch.nn.Linear(2, 1))
    third.backward(model(torch.ones(1, 2) * (rank + 1)).sum())
    found["after_end_training_grad"] = model.module.weight.grad.tolist()
    report(found)


if __name__ == "__main__":
    main()
