"""By default a prepared loader draws from torch's global RNG exactly what Accelerate's does.

A script migrated from Accelerate with the same seed must see the same batches and, after them,
the same random numbers (dropout masks, augmentations): Accelerate 1.15 leaves
``use_seedable_sampler`` off, so its loaders draw as plain torch's do. One process: each epoch
draws the workers' base seed, then the RandomSampler's seed. Several: ``prepare`` gives the
RandomSampler a generator seeded by one global draw (synchronized from rank 0 at every epoch); each
epoch draws the base seed. The references below are plain torch doing those draws; the numbers
they produce were checked against Accelerate 1.15.0 (``accelerate launch``, same script).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from x_runtime import Accelerator, DataLoaderConfiguration
from x_runtime.data.loader.prepare import prepare_data_loader
from x_runtime.data.samplers import SeedableRandomSampler


def _draw() -> int:
    return int(torch.empty((), dtype=torch.int64).random_().item())


def _plain(shuffle: bool) -> dict:
    torch.manual_seed(0)
    loader = DataLoader(range(8), batch_size=4, shuffle=shuffle)
    return {"epochs": [[b.tolist() for b in loader] for _ in range(2)], "next": torch.rand(1).item()}


def _accelerate_two_processes(rank: int, shuffle: bool) -> dict:
    """What Accelerate 1.15.0's prepared loader yields and draws on ``rank`` of 2 (every rank seeded 0)."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(_draw()) if shuffle else None  # at prepare
    sampler = RandomSampler(range(8), generator=generator) if shuffle else SequentialSampler(range(8))
    epochs = []
    for _ in range(2):
        _draw()  # the DataLoader iterator's base seed
        batches = list(BatchSampler(sampler, 4, False))
        epochs.append([batches[rank]])
    return {"epochs": epochs, "next": torch.rand(1).item()}


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "sequential"])
def test_one_process_draws_as_plain_torch(shuffle: bool) -> None:
    want = _plain(shuffle)
    torch.manual_seed(0)
    loader = Accelerator(cpu=True).prepare(DataLoader(range(8), batch_size=4, shuffle=shuffle))
    got = {"epochs": [[b.tolist() for b in loader] for _ in range(2)], "next": torch.rand(1).item()}
    assert got == want
    torch.manual_seed(0)
    loader = prepare_data_loader(DataLoader(range(8), batch_size=4, shuffle=shuffle), num_processes=1, process_index=0)
    assert [[b.tolist() for b in loader] for _ in range(2)] == want["epochs"] and torch.rand(1).item() == want["next"]


def test_the_reference_is_what_accelerate_printed() -> None:
    # Accelerate 1.15.0, 2 processes, shuffle: rank 0 [[2, 5, 4, 6]] then [[4, 2, 1, 6]], next 0.4901.
    reference = _accelerate_two_processes(0, True)
    assert reference["epochs"] == [[[2, 5, 4, 6]], [[4, 2, 1, 6]]]
    assert round(reference["next"], 4) == 0.4901
    assert round(_plain(True)["next"], 4) == 0.4556  # one process (Accelerate printed the same)


def test_two_processes_draw_as_accelerate(tmp_path, launch) -> None:
    launch("global_rng_worker.py", 2, str(tmp_path))
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for shuffle in (True, False):
            assert got[str(shuffle)] == _accelerate_two_processes(rank, shuffle), (rank, shuffle)


def test_asking_for_the_seedable_sampler_keeps_it() -> None:
    config = DataLoaderConfiguration(use_seedable_sampler=True)
    loader = Accelerator(cpu=True, dataloader_config=config).prepare(DataLoader(range(8), batch_size=4, shuffle=True))
    assert isinstance(loader.sampler, SeedableRandomSampler)
    torch.manual_seed(3)
    list(DataLoader(range(8), batch_size=4))  # a plain iteration draws its workers' base seed, once
    plain = torch.get_rng_state()
    torch.manual_seed(3)
    list(loader)
    assert torch.equal(torch.get_rng_state(), plain)  # the seedable sampler itself draws nothing, as in Accelerate
