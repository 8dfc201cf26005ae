"""Index-level sampling: seedable shuffling, batch-sampler shards and skipping, checked by value."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from x_runtime.data.samplers import BatchSamplerShard, SeedableRandomSampler, SkipBatchSampler


def batches(size: int, batch_size: int, drop_last: bool = False) -> BatchSampler:
    return BatchSampler(SequentialSampler(range(size)), batch_size, drop_last)


def shards(size: int, batch_size: int, processes: int, **kwargs) -> list[BatchSamplerShard]:
    return [BatchSamplerShard(batches(size, batch_size), processes, rank, **kwargs) for rank in range(processes)]


# --- SeedableRandomSampler ------------------------------------------------------------------


def test_order_depends_on_seed_and_epoch_only() -> None:
    a, b = SeedableRandomSampler(range(50), seed=4), SeedableRandomSampler(range(50), seed=4)
    torch.manual_seed(0)
    first = list(a)
    torch.manual_seed(1)  # the global RNG plays no part
    assert list(b) == first and sorted(first) == list(range(50))
    assert list(a) != first  # epoch 1
    assert list(SeedableRandomSampler(range(50), seed=5)) != first
    assert isinstance(a, RandomSampler)


@pytest.mark.parametrize(("replacement", "num_samples"), [(False, None), (False, 70), (True, 75)])
def test_order_is_accelerates_to_the_index(replacement: bool, num_samples: int | None) -> None:
    """The same (seed, epoch) gives Accelerate's order: a run moved between the two shuffles alike."""
    accelerate = pytest.importorskip("accelerate.data_loader")
    ours = SeedableRandomSampler(range(50), replacement=replacement, num_samples=num_samples, data_seed=4)
    theirs = accelerate.SeedableRandomSampler(range(50), replacement=replacement, num_samples=num_samples, data_seed=4)
    for _ in range(3):  # epochs 0, 1, 2
        assert list(ours) == list(theirs)
    torch.manual_seed(11)  # no data_seed: the initial seed, as Accelerate reads it
    assert list(SeedableRandomSampler(range(9))) == list(accelerate.SeedableRandomSampler(range(9)))


def test_epoch_advances_only_when_an_iteration_completes() -> None:
    sampler = SeedableRandomSampler(range(10), seed=0)
    first = list(sampler)
    assert sampler.epoch == 1
    iterator = iter(sampler)
    next(iterator)
    del iterator
    assert sampler.epoch == 1
    sampler.set_epoch(0)
    assert list(sampler) == first and sampler.epoch == 1


def test_replacement_and_num_samples() -> None:
    longer = list(SeedableRandomSampler(range(4), num_samples=10, seed=1))
    assert len(longer) == 10 and sorted(longer[:4]) == [0, 1, 2, 3] and sorted(longer[4:8]) == [0, 1, 2, 3]
    drawn = list(SeedableRandomSampler(range(3), replacement=True, num_samples=30, seed=1))
    assert len(drawn) == 30 and set(drawn) <= {0, 1, 2}
    assert drawn == list(SeedableRandomSampler(range(3), replacement=True, num_samples=30, seed=1))


# --- BatchSamplerShard ----------------------------------------------------------------------


def test_batches_are_dealt_round_robin_and_the_last_step_padded_from_the_start() -> None:
    got = [list(shard) for shard in shards(10, 2, 3)]
    assert got == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [0, 1]]]
    assert [shard.remainder for shard in shards(10, 2, 3) if list(shard)] == [4, 4, 4]
    padded = shards(11, 2, 3)
    assert [list(shard) for shard in padded] == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 0]]]
    assert {shard.remainder for shard in padded} == {5}
    assert [len(shard) for shard in padded] == [2, 2, 2]


def test_uneven_and_drop_last() -> None:
    uneven = shards(11, 2, 3, even_batches=False)
    assert [list(shard) for shard in uneven] == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10]]]
    assert [len(shard) for shard in uneven] == [2, 2, 2]
    fewer = shards(8, 2, 3, even_batches=False)
    assert [list(shard) for shard in fewer] == [[[0, 1], [6, 7]], [[2, 3]], [[4, 5]]]
    assert [len(shard) for shard in fewer] == [2, 1, 1] and fewer[0].remainder == -1
    dropped = shards(11, 2, 3, drop_last=True)
    assert [list(shard) for shard in dropped] == [[[0, 1]], [[2, 3]], [[4, 5]]]
    assert [len(shard) for shard in dropped] == [1, 1, 1] and dropped[0].remainder == 6


def test_split_batches_cut_each_batch() -> None:
    split = shards(10, 4, 2, split_batches=True)
    assert [list(shard) for shard in split] == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]
    assert split[0].remainder == 2 and split[0].batch_size == 2 and split[0].total_batch_size == 4
    uneven = shards(9, 4, 2, split_batches=True, even_batches=False)
    assert [list(shard) for shard in uneven] == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7]]]
    assert [len(shard) for shard in uneven] == [3, 2]
    with pytest.raises(ValueError, match=r"batch size \(4\).*processes \(3\)"):
        BatchSamplerShard(batches(12, 4), 3, 0, split_batches=True)


def test_tiny_epochs_cycle_through_the_samples() -> None:
    tiny = shards(3, 2, 3)
    assert [list(shard) for shard in tiny] == [[[0, 1]], [[2, 0]], [[1, 2]]]
    assert tiny[0].remainder == 3


def test_shards_keep_sampler_and_reject_bad_ranks() -> None:
    random = BatchSampler(RandomSampler(range(4)), 2, False)
    assert BatchSamplerShard(random, 2, 1).sampler is random.sampler
    with pytest.raises(ValueError, match="process_index"):
        BatchSamplerShard(random, 2, 2)


# --- SkipBatchSampler -----------------------------------------------------------------------


def test_skip_batch_sampler_skips_every_time_plus_once() -> None:
    skipper = SkipBatchSampler(batches(10, 2), skip_batches=1)
    assert list(skipper) == [[2, 3], [4, 5], [6, 7], [8, 9]] and len(skipper) == 4
    skipper.skip_once = 2
    assert len(skipper) == 2
    assert list(skipper) == [[6, 7], [8, 9]]
    assert list(skipper) == [[2, 3], [4, 5], [6, 7], [8, 9]]  # skip_once is spent
    assert list(SkipBatchSampler(batches(4, 2), 5)) == [] and len(SkipBatchSampler(batches(4, 2), 5)) == 0
    assert skipper.batch_size == 2 and skipper.drop_last is False


class _General(BatchSampler):
    """A BatchSampler subclass: the shard deals its batches by the general rule, not rank_share."""


def _walk(batch_sampler_type, n, batch, batch_drop_last, world, rank, even, drop_last, seeded, drop, skip):
    sampler = SeedableRandomSampler(range(n), seed=3) if seeded else SequentialSampler(range(n))
    shard = BatchSamplerShard(
        batch_sampler_type(sampler, batch, batch_drop_last), world, rank, even_batches=even, drop_last=drop_last
    )
    shard.stream_skip_once = drop
    length = len(shard)
    shard.skip_once = skip
    batches = list(shard)
    return batches, shard.remainder, length, getattr(sampler, "epoch", None)


@pytest.mark.parametrize("seeded", [False, True], ids=["sequential", "seedable"])
@pytest.mark.parametrize("world", [2, 3])
def test_cutting_a_ranks_batches_from_the_order_gives_the_general_rules_batches(world, seeded) -> None:
    """rank_share (one slice per step) against the general dealing: batches, remainder, len, epoch."""
    compared = 0
    for n, batch, batch_drop_last, even, drop_last, drop, skip in itertools.product(
        [1, 5, 12, 13, 37], [1, 3, 4], [False, True], [True, False], [False, True], [0, 1, 3], [0, 1]
    ):
        for rank in range(world):
            args = (n, batch, batch_drop_last, world, rank, even, drop_last, seeded, drop, skip)
            assert _walk(BatchSampler, *args) == _walk(_General, *args), args
            compared += 1
    assert compared == 720 * world
