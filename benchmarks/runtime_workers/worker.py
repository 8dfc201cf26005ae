"""One variant of bench_runtime.py in fresh processes, timing what the benchmark asks for, block by block.

    python worker.py VARIANT PORT [--micro-steps N] [--models M] [--device cuda] ...   # one process
    python -m torch.distributed.run --standalone --nproc_per_node 2 worker.py VARIANT PORT ...

VARIANT is "plain" (PyTorch by hand: DDP and a DistributedSampler when distributed), "accelerate"
or "x" (``Accelerator(cpu=True)`` and ``prepare``; ``Accelerator()`` with ``--device cuda``, where
every rank uses GPU LOCAL_RANK, the group is NCCL's, plain moves the model and each loader batch to
the GPU by hand, and each timed block ends with ``torch.cuda.synchronize``). Every rank connects to the benchmark on
127.0.0.1:PORT, says hello with the token from $BENCH_RUNTIME_TOKEN, then runs the commands it
receives, one JSON line each, answering one JSON line when done:

    {"task": "setup"}            -> seconds (once; asked of 2 processes on CPU, of 1 and 2 on GPUs)
    {"task": T, "warmup": true}  -> null: build and prepare what task T needs, run it untimed
    {"task": T}                  -> one timed block of task T (seconds per call, or samples/s)
    {"task": "quit"}             -> {"threads": torch's thread count}, then the process exits

Tasks: "micro" / "small" (training steps), "loader" (--loader-epochs epochs), "gather" (distributed only).
The benchmark keeps the three variants alive at once and sends blocks round-robin, so that load
from elsewhere hits them alike; idle ones wait on their socket and take no CPU.

The library is imported before anything is timed (imports are measured separately). With 2
processes the gloo process group is created first, the same way for all variants: its rendezvous
measures only when the other rank started; ``Accelerator()`` joins the existing group, as both
libraries do. Blocks start with a barrier (not timed) so both ranks start a block together.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SAMPLES, FEATURES, LOADER_BATCH = 20_000, 32, 64
TRAIN_BATCH, BATCHES = 32, 8  # pre-made training batches, cycled through


def micro_model() -> torch.nn.Module:
    """289 parameters: the step is all fixed overhead."""
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def small_model() -> torch.nn.Module:
    """1.6M parameters: an MLP whose step is mostly arithmetic (and, on 2 processes, all-reduce)."""
    return torch.nn.Sequential(
        torch.nn.Linear(512, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 10),
    )


def dataset() -> TensorDataset:
    return TensorDataset(torch.randn(SAMPLES, FEATURES), torch.randint(0, 10, (SAMPLES,)))


class Variant:
    """What differs between plain PyTorch, Accelerate and x: preparing, and backward."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.device = device
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.accelerator: Any = None
        if name == "accelerate":
            from accelerate import Accelerator
        elif name == "x":
            from x_runtime import Accelerator
        elif name == "plain":
            Accelerator = None
        else:
            raise SystemExit(f"unknown variant {name!r}")
        self._accelerator_class = Accelerator

    def make_accelerator(self) -> None:
        if self._accelerator_class is not None and self.accelerator is None:
            gpu = self.device.type == "cuda"
            self.accelerator = self._accelerator_class() if gpu else self._accelerator_class(cpu=True)

    def plain_loader(self, data: TensorDataset) -> DataLoader:
        if self.world > 1:
            return DataLoader(data, batch_size=LOADER_BATCH, sampler=DistributedSampler(data, shuffle=True))
        return DataLoader(data, batch_size=LOADER_BATCH, shuffle=True)

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader | None) -> Any:
        """(model, optimizer, loader) ready to train; ``loader`` may be None."""
        if self.name == "plain":
            if self.device.type == "cuda":
                model = model.to(self.device)
            if self.world > 1:
                ids = [self.device.index] if self.device.type == "cuda" else None
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
            return model, optimizer, None if loader is None else self.plain_loader(loader.dataset)
        self.make_accelerator()
        if loader is None:
            return (*self.accelerator.prepare(model, optimizer), None)
        return self.accelerator.prepare(model, optimizer, loader)

    def prepare_loader(self, loader: DataLoader) -> DataLoader:
        if self.name == "plain":
            return self.plain_loader(loader.dataset)
        self.make_accelerator()
        return self.accelerator.prepare(loader)

    def backward(self) -> Callable[[torch.Tensor], None]:
        return torch.Tensor.backward if self.name == "plain" else self.accelerator.backward

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def sync(self) -> None:
        """Wait for the GPU's queued work, so a block's time includes it (nothing on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class Tasks:
    """The benchmark's tasks for one variant; state (models, loaders) is built at warm-up."""

    def __init__(self, variant: Variant, args: argparse.Namespace) -> None:
        self.variant = variant
        self.args = args
        self.blocks: dict[str, Callable[[], float]] = {}

    def setup(self) -> float:
        model = small_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = DataLoader(dataset(), batch_size=LOADER_BATCH, shuffle=True)
        self.variant.barrier()
        start = time.perf_counter()
        self.variant.make_accelerator()
        self.variant.prepare(model, optimizer, loader)
        self.variant.sync()
        return time.perf_counter() - start

    def warmup(self, task: str) -> None:
        torch.manual_seed(0)  # same weights and data for every variant
        if task == "micro":
            inputs = [(torch.randn(TRAIN_BATCH, 16), torch.randn(TRAIN_BATCH, 1)) for _ in range(BATCHES)]
            block = self._training(micro_model, inputs, torch.nn.functional.mse_loss, self.args.micro_steps)
            warm = 3
        elif task == "small":
            inputs = [(torch.randn(TRAIN_BATCH, 512), torch.randint(0, 10, (TRAIN_BATCH,))) for _ in range(BATCHES)]
            block = self._training(small_model, inputs, torch.nn.functional.cross_entropy, self.args.small_steps)
            warm = 2
        elif task == "loader":
            block, warm = self._loader(), 1
        elif task == "gather":
            block, warm = self._gather(self.args.gather_calls), 2
        else:
            raise SystemExit(f"unknown task {task!r}")
        for _ in range(warm):
            block()
        self.blocks[task] = block

    def run(self, task: str) -> float:
        self.variant.barrier()
        return self.blocks[task]()

    def _training(
        self, make_model: Callable[[], torch.nn.Module], batches: list, loss_fn: Any, steps: int
    ) -> Callable[[], float]:
        # Identical copies of a model built in one process train at steadily different speeds (up to
        # 25% apart on 2 processes, round after round): a block steps each of a few copies in turn,
        # so that one copy's luck does not decide a variant's figure.
        trained = []
        for _ in range(self.args.models):
            model = make_model()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            trained.append(self.variant.prepare(model, optimizer, None)[:2])
        backward = self.variant.backward()
        batches = [(inputs.to(self.variant.device), targets.to(self.variant.device)) for inputs, targets in batches]
        count, per_model = len(batches), max(1, steps // len(trained))
        sync = self.variant.sync

        def block() -> float:
            start = time.perf_counter()
            for model, optimizer in trained:
                for i in range(per_model):
                    inputs, targets = batches[i % count]
                    optimizer.zero_grad()
                    loss = loss_fn(model(inputs), targets)
                    backward(loss)
                    optimizer.step()
            sync()
            return (time.perf_counter() - start) / (per_model * len(trained))

        return block

    def _loader(self) -> Callable[[], float]:
        """Samples per second on this rank over --loader-epochs epochs."""
        variant = self.variant
        loader = variant.prepare_loader(DataLoader(dataset(), batch_size=LOADER_BATCH, shuffle=True))
        epochs = iter(range(1 << 30))
        # The prepared loaders put each whole batch on the GPU (blocking copies); by hand the same.
        by_hand = variant.name == "plain" and variant.device.type == "cuda"

        def block() -> float:
            seen, elapsed = 0, 0.0
            for _ in range(self.args.loader_epochs):
                if variant.name == "plain" and variant.world > 1:
                    loader.sampler.set_epoch(next(epochs))  # what a hand-written DistributedSampler loop does
                start = time.perf_counter()
                for inputs, targets in loader:
                    if by_hand:
                        inputs, targets = inputs.to(variant.device), targets.to(variant.device)
                    seen += len(inputs)
                variant.sync()
                elapsed += time.perf_counter() - start
            return seen / elapsed

        return block

    def _gather(self, calls: int) -> Callable[[], float]:
        variant = self.variant
        tensor = torch.randn(64, 10, device=variant.device)
        if variant.name == "plain":

            def gather() -> torch.Tensor:
                out = tensor.new_empty((variant.world * tensor.shape[0], *tensor.shape[1:]))
                dist.all_gather_into_tensor(out, tensor)
                return out

        else:

            def gather() -> torch.Tensor:
                return variant.accelerator.gather_for_metrics(tensor)

        rows = gather().shape[0]  # after the loader task ran an epoch: no stale end-of-epoch trimming
        if rows != variant.world * tensor.shape[0]:
            raise SystemExit(f"{variant.name}: gather returned {rows} rows, expected {variant.world * tensor.shape[0]}")

        def block() -> float:
            start = time.perf_counter()
            for _ in range(calls):
                gather()
            variant.sync()
            return (time.perf_counter() - start) / calls

        return block


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant")
    parser.add_argument("port", type=int)
    parser.add_argument("--micro-steps", type=int, default=30, help="training steps per timed block")
    parser.add_argument("--small-steps", type=int, default=3)
    parser.add_argument("--gather-calls", type=int, default=50)
    parser.add_argument("--loader-epochs", type=int, default=1, help="epochs per DataLoader block")
    parser.add_argument("--models", type=int, default=1, help="copies of each model a training block steps in turn")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    torch.set_num_threads(1)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # the CUDA context now, not inside the first timed block
        torch.cuda.synchronize(device)
    variant = Variant(args.variant, device)
    if variant.world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    tasks = Tasks(variant, args)
    with socket.create_connection(("127.0.0.1", args.port)) as conn, conn.makefile("rw") as channel:
        hello = {"token": os.environ["BENCH_RUNTIME_TOKEN"], "variant": variant.name, "rank": variant.rank}
        channel.write(json.dumps(hello) + "\n")
        channel.flush()
        for line in channel:
            command = json.loads(line)
            task = command["task"]
            if task == "quit":
                reply: Any = {"threads": torch.get_num_threads()}
            elif task == "setup":
                reply = tasks.setup()
            elif command.get("warmup"):
                reply = tasks.warmup(task)
            else:
                reply = tasks.run(task)
            channel.write(json.dumps(reply) + "\n")
            channel.flush()
            if task == "quit":
                break
    if variant.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    # Skip the interpreter's teardown of torch (a second or more on a busy machine): nothing is left to write.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
