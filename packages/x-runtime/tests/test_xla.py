"""XLA through torch_xla on its CPU runtime (``PJRT_DEVICE=CPU``): ``nox -s tests_xla_cpu``.

torch_xla needs its own torch (see constraints/tpu.txt), so these tests run in their own session,
not in the default CI run; without torch_xla this module is skipped. One process, one XLA
device: training parity with plain PyTorch, the parallel loader's bookkeeping, checkpoints, RNG,
bf16, collectives, and ``x-launch --tpu``. What needs several TPU cores is in test_xla_tpu.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch_xla = pytest.importorskip("torch_xla", reason="torch_xla runs in nox -s tests_xla_cpu (its own torch)")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from x_common import env  # noqa: E402
from x_runtime import Accelerator  # noqa: E402
from x_runtime.core.random_state import set_seed  # noqa: E402

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture(autouse=True)
def _xla_cpu(monkeypatch) -> None:
    monkeypatch.setenv(env.PJRT_DEVICE.name, "CPU")  # XLA chosen the way torch_xla users choose it
    # torch's autograd engine sizes its per-device queues at the first backward of the process: the
    # XLA runtime must be up by then, or a later backward on the XLA device fails an internal assert.
    torch_xla.device()


def _data(n: int = 40) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [2.0], [-1.0], [0.5]]))


def _model(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 1)
    )


def _plain_reference(steps: int = 2, max_norm: float = 0.5) -> dict[str, torch.Tensor]:
    """The loop below in plain PyTorch on the CPU: accumulation, clipping, AdamW, StepLR."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    loader = DataLoader(_data(), batch_size=8)
    for index, (x, y) in enumerate(loader):
        (torch.nn.functional.mse_loss(model(x), y) / steps).backward()
        if index % steps == steps - 1 or index == len(loader) - 1:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return model.state_dict()


def test_training_on_the_xla_device_matches_plain_pytorch_on_cpu() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=2)
    assert (accelerator.distributed_type, accelerator.device.type, accelerator.num_processes) == ("XLA", "xla", 1)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    model, optimizer, loader, scheduler = accelerator.prepare(
        model, optimizer, DataLoader(_data(), batch_size=8), scheduler
    )
    assert type(loader).__name__ == "XLADeviceLoader" and len(loader) == 5
    seen = []
    for x, y in loader:
        with accelerator.accumulate(model):
            assert x.device.type == "xla" and next(model.parameters()).device.type == "xla"
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            seen.append((accelerator.gradient_state.end_of_dataloader, accelerator.sync_gradients))
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    # Gradients sync on every second batch and on the last one (5 batches, 3 optimizer steps).
    assert seen == [(False, False), (False, True), (False, False), (False, True), (True, True)]
    got = accelerator.get_state_dict(model)
    want = _plain_reference()
    assert all(tensor.device.type == "cpu" for tensor in got.values())
    assert max((got[name] - want[name]).abs().max().item() for name in want) < 1e-5
    assert scheduler.get_last_lr() == pytest.approx([0.05 * 0.7**3])


def test_gradients_are_averaged_once_per_boundary_and_never_between(monkeypatch) -> None:
    # Which calls average across replicas (a no-op in a world of one, so it is observed, not faked).
    import torch_xla.core.xla_model as xm

    averaged, micro_step, original = [], [0], xm.reduce_gradients
    monkeypatch.setattr(
        xm, "reduce_gradients", lambda opt, *a, **k: (averaged.append(micro_step[0]), original(opt, *a, **k))
    )
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.state.world_size = 2  # as on two TPU cores: averaging is due on boundaries
    for step in range(4):
        micro_step[0] = step
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(2, 4, device=accelerator.device)).sum())
            accelerator.clip_grad_norm_(model.parameters(), 1.0)  # every micro-step, as many scripts do
            optimizer.step()
            optimizer.zero_grad()
    assert averaged == [1, 3]  # on the boundaries only, once each (clipping did it; the step did not redo it)


def test_each_optimizer_is_averaged_when_its_parameters_are_clipped(monkeypatch) -> None:
    # A GAN's step: two losses, two optimizers; the second backward makes new local gradients.
    import torch_xla.core.xla_model as xm

    averaged, original = [], xm.reduce_gradients
    monkeypatch.setattr(xm, "reduce_gradients", lambda opt, *a, **k: (averaged.append(opt), original(opt, *a, **k)))
    accelerator = Accelerator()
    d_model, g_model = torch.nn.Linear(4, 1), torch.nn.Linear(4, 4)
    d_opt, g_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (d_model, g_model))
    d_model, g_model, d_opt, g_opt = accelerator.prepare(d_model, g_model, d_opt, g_opt)
    accelerator.state.world_size = 2
    x = torch.ones(2, 4, device=accelerator.device)
    accelerator.backward(d_model(g_model(x).detach()).sum())
    accelerator.clip_grad_norm_(d_model.parameters(), 1.0)
    d_opt.step()
    accelerator.backward(d_model(g_model(x)).sum())
    accelerator.clip_grad_norm_(g_model.parameters(), 1.0)
    g_opt.step()
    assert averaged == [d_opt.optimizer, g_opt.optimizer]  # each once, after its own backward


def test_tied_weights_stay_tied_on_the_device_and_train_like_plain_pytorch() -> None:
    def tied() -> torch.nn.Module:
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 10, bias=False))
        model[1].weight = model[0].weight  # as language models tie their output head to the embedding
        return model

    def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        tokens = torch.arange(8, device=device).remainder(10)
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(tokens), tokens)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    accelerator = Accelerator()
    model = tied()
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    assert model[1].weight is model[0].weight and len(list(model.parameters())) == 1
    assert optimizer.param_groups[0]["params"][0] is model[0].weight
    train(model, optimizer, accelerator.device)
    reference = tied()
    train(reference, torch.optim.AdamW(reference.parameters(), lr=0.1), torch.device("cpu"))
    assert (model[0].weight.cpu() - reference[0].weight).abs().max().item() < 1e-5


def test_loader_flags_follow_the_loop_not_the_read_ahead() -> None:
    # 37 samples in batches of 2: 19 batches, more than ParallelLoader reads ahead (16); the last holds 1.
    accelerator = Accelerator()
    numbers = torch.arange(37, dtype=torch.float32)
    loader = accelerator.prepare(DataLoader(TensorDataset(numbers), batch_size=2))
    flags, positions, gathered = [], [], []
    for (batch,) in loader:
        flags.append(accelerator.gradient_state.end_of_dataloader)
        positions.append(loader.state_dict()["batches_yielded"])
        gathered.append(accelerator.gather_for_metrics(batch).cpu())
    assert flags == [False] * 18 + [True]
    assert positions == list(range(1, 20))
    assert torch.equal(torch.cat(gathered), numbers)
    assert loader.state_dict() == {
        "epoch": 1,
        "seed": None,
        "batches_yielded": 0,
        "num_processes": 1,
        "stream_batches": 0,
    }


def test_leaving_the_loop_early_keeps_the_loops_position() -> None:
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(60.0)), batch_size=2))
    for index, _ in enumerate(loader):
        if index == 2:
            break
    # The reader thread was up to 16 batches ahead; the epoch is not over and 3 batches were used.
    assert loader.state_dict() == {
        "epoch": 0,
        "seed": None,
        "batches_yielded": 3,
        "num_processes": 1,
        "stream_batches": 3,
    }
    assert not accelerator.gradient_state.in_dataloader
    (first,) = next(iter(loader))
    assert first.cpu().tolist() == [0.0, 1.0]  # a new iteration starts the unfinished epoch again


def test_a_checkpoint_after_skip_first_batches_records_the_loops_place() -> None:
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(80.0)), batch_size=2))
    resumed = accelerator.skip_first_batches(loader, 2)
    for index, _ in enumerate(resumed):
        if index == 3:
            # What save_state records: the original loader, 2 skipped + 4 received (not the read-ahead).
            assert loader.state_dict()["batches_yielded"] == 6 and resumed.state_dict()["batches_yielded"] == 6
            break


def test_xla_generator_starts_from_torchs_seed() -> None:
    import torch_xla.core.xla_model as xm

    torch.manual_seed(11)  # as set_seed() before Accelerator() leaves it
    device = Accelerator().device
    first = torch.rand(3, device=device).cpu()
    xm.set_rng_state(11)
    assert torch.equal(first, torch.rand(3, device=device).cpu())


class _Broken(Dataset):
    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 21:
            raise KeyError(f"sample {index} is corrupt")
        return torch.tensor([float(index)])


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from (torch.tensor([float(i)]) for i in range(7))

    def __len__(self) -> int:
        return 7


def test_an_iterable_dataset_is_read_by_each_replica_not_dispatched() -> None:
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(_Stream(), batch_size=2))
    batches, flags = [], []
    for batch in loader:
        batches.append(batch.cpu().flatten().tolist())
        flags.append(accelerator.gradient_state.end_of_dataloader)
    assert batches == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0]]
    assert flags == [False, False, False, True]
    assert type(loader._loader).__name__ == "DataLoaderShard"


def test_an_error_in_the_dataset_reaches_the_loop() -> None:
    # torch_xla's reader thread alone would print it and end the epoch early, silently.
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(_Broken(), batch_size=3))
    received = []
    with pytest.raises(KeyError, match="sample 21 is corrupt"):
        for batch in loader:
            received.append(batch)
    assert len(received) == 6  # batches 0-5: batch 6 is held back by the one-batch look-ahead every loader has


def _train_epochs(accelerator: Accelerator, folder: Path, *, stop_after: int | None = None, resume: bool = False):
    """Two shuffled epochs of a dropout model; returns the losses of every step taken."""
    set_seed(7)
    model = _model(dropout=0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_data(48), batch_size=6, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, taken = [], 0
    start_epoch, skip = 0, 0
    if resume:
        accelerator.load_state(str(folder))
        start_epoch, skip = loader.epoch, loader.state_dict()["batches_yielded"]
    for epoch in range(start_epoch, 2):
        batches = accelerator.skip_first_batches(loader, skip) if epoch == start_epoch and skip else loader
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            taken += 1
            if stop_after is not None and taken == stop_after:
                accelerator.save_state(str(folder))
                return losses
    return losses


def test_resuming_mid_epoch_continues_identically(tmp_path: Path) -> None:
    whole = _train_epochs(Accelerator(), tmp_path / "unused")
    first = _train_epochs(Accelerator(), tmp_path / "ckpt", stop_after=11)  # 8 batches per epoch: epoch 1, batch 3
    saved = json.loads((tmp_path / "ckpt" / "dataloaders.json").read_text())
    assert [(s["epoch"], s["batches_yielded"]) for s in saved] == [(1, 3)]
    assert "xla" in torch.load(tmp_path / "ckpt" / "random_states_0.bin", weights_only=True)
    rest = _train_epochs(Accelerator(), tmp_path / "ckpt", resume=True)
    assert len(whole) == 16 and first + rest == whole  # dropout masks and shuffles replayed exactly


def test_set_seed_seeds_the_xla_generator() -> None:
    device = Accelerator().device

    def draw(seed: int) -> list[float]:
        set_seed(seed)
        return torch.rand(4, device=device).cpu().tolist()

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_bf16_autocasts_on_the_xla_device_and_returns_fp32() -> None:
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    inner = []
    model[0].register_forward_hook(lambda module, args, out: inner.append(out.dtype))
    out = model(torch.ones(2, 4, device=accelerator.device))
    assert inner == [torch.bfloat16] and out.dtype == torch.float32


def test_fp16_on_xla_is_refused_with_the_alternative() -> None:
    with pytest.raises(ValueError) as caught:
        Accelerator(mixed_precision="fp16")
    assert str(caught.value) == "mixed_precision='fp16' on an XLA device: TPUs compute in bf16; use 'bf16' or 'no'"


def test_collectives_in_a_world_of_one_keep_values_on_the_device() -> None:
    accelerator = Accelerator()
    device = accelerator.device
    gathered = accelerator.gather({"a": torch.tensor([1.0, 2.0], device=device)})
    assert gathered["a"].device.type == "xla" and gathered["a"].cpu().tolist() == [1.0, 2.0]
    assert accelerator.reduce(torch.tensor([3.0], device=device), "sum", scale=0.5).cpu().tolist() == [1.5]
    padded = accelerator.pad_across_processes(torch.ones(2, 3, device=device), dim=1)
    assert padded.shape == (2, 3)
    assert accelerator.gather_for_metrics(["x"], use_gather_object=True) == ["x"]
    accelerator.wait_for_everyone()
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()


def test_save_model_and_save_write_cpu_files(tmp_path: Path) -> None:
    accelerator = Accelerator()
    model = accelerator.prepare(_model())
    accelerator.save_model(model, tmp_path / "model")
    written = load_file(tmp_path / "model" / "model.safetensors")
    assert written.keys() == model.state_dict().keys()
    assert all(torch.equal(written[k], v.cpu()) for k, v in model.state_dict().items())
    accelerator.save({"w": model[0].weight}, tmp_path / "w.pt")
    assert torch.load(tmp_path / "w.pt", weights_only=True)["w"].device.type == "cpu"


def _one_xla_process(argv: list[str], out: Path) -> dict:
    """Run ``argv`` (a launch of workers/xla_worker.py) on the XLA CPU runtime; rank 0's report."""
    result = subprocess.run(
        [*argv, str(out)], capture_output=True, text=True, timeout=300, env={**os.environ, env.PJRT_DEVICE.name: "CPU"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "rank0.json").read_text())


def test_x_launch_tpu_trains_one_process_on_the_xla_cpu_runtime(tmp_path: Path) -> None:
    x_launch = Path(sys.executable).with_name("x-launch")
    report = _one_xla_process(
        [str(x_launch), "--tpu", "--num_processes", "1", str(WORKERS / "xla_worker.py")], tmp_path
    )
    assert report["distributed_type"] == "XLA" and report["device"] == "xla:0" and report["world"] == 1
    assert report["losses"][-1] < report["losses"][0] and all(math.isfinite(v) for v in report["losses"])


def test_torchrun_with_pjrt_device_trains_one_xla_process(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(WORKERS)!r})\nimport xla_worker\nxla_worker.main()\n")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    report = _one_xla_process([*torchrun, str(script)], tmp_path)
    assert (report["distributed_type"], report["device"], report["world"]) == ("XLA", "xla:0", 1)
