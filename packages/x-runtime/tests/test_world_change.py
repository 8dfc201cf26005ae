"""Resuming at another world size (an elastic job that lost or gained a machine): every sample of
the epoch is still used exactly once, and ``gather_for_metrics`` returns each one once.

A prepared loader's state records where its epoch stands in the stream of the underlying
loader's batches, which every world size shares (``stream_batches``). Loaded with another
number of processes, the epoch goes on from there: through ``batches_yielded`` when the new
world's steps end at the same place, else by dropping the used batches from the shard's stream.
"""

from __future__ import annotations

import itertools
import json
import warnings

import pytest
from torch.utils.data import DataLoader

from x_runtime.data.loader.prepare import prepare_data_loader, skip_first_batches

SEED = 7


def _world(samples: int, world: int, batch: int, *, shuffle: bool, drop_last: bool, split: bool = False) -> list:
    return [
        prepare_data_loader(
            DataLoader(list(range(samples)), batch_size=batch, shuffle=shuffle, drop_last=drop_last),
            num_processes=world,
            process_index=rank,
            split_batches=split,
            data_seed=SEED,
            # The ranks here share one process, so nothing synchronises a default sampler's draw
            # between them; integration-tests/test_elastic.py resumes the default at a new world size.
            use_seedable_sampler=True,
        )
        for rank in range(world)
    ]


def _resume(samples, batch, before, after, steps, *, shuffle, drop_last=False, split=False, forget=()):
    """Indices used by ``steps`` steps on ``before`` processes, then the rest of the epoch on ``after``."""
    first = _world(samples, before, batch, shuffle=shuffle, drop_last=drop_last, split=split)
    iterators = [iter(loader) for loader in first]
    used = [index for _ in range(steps) for it in iterators for index in next(it).tolist()]
    state = first[0].state_dict()  # what save_state writes (the main process's loader state)
    state = {key: value for key, value in state.items() if key not in forget}
    second = _world(samples, after, batch, shuffle=shuffle, drop_last=drop_last, split=split)
    for loader in second:
        loader.load_state_dict(state)
    assert second[0].epoch == state["epoch"], "a mid-epoch state resumes that epoch"
    # The skip_first_batches resume path (the stateful loader resumes by itself).
    second = [skip_first_batches(loader, loader.state_dict()["batches_yielded"]) for loader in second]
    lengths = {len(loader) for loader in second}
    per_rank = [list(loader) for loader in second]
    assert lengths == {len(per_rank[0])}, f"len() said {lengths}, the ranks yielded {[len(b) for b in per_rank]}"
    remainder = second[0].remainder
    for number, step in enumerate(zip(*per_rank, strict=True)):
        indices = [index for batch in step for index in batch.tolist()]
        # The padding of the last step (even_batches) is what gather_for_metrics drops.
        used += indices[:remainder] if number == len(per_rank[0]) - 1 and remainder >= 0 else indices
    return used


@pytest.mark.parametrize("shuffle", [False, True], ids=["sequential", "shuffled"])
@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 3), (4, 3), (2, 1), (4, 2)])
def test_every_sample_once_at_the_new_world_size(before, after, shuffle) -> None:
    checked = 0
    for samples, batch in itertools.product((23, 37, 60), (2, 3)):
        total = len(_world(samples, before, batch, shuffle=shuffle, drop_last=False)[0])
        for steps in range(1, total):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no "used twice" fallback on this path
                used = _resume(samples, batch, before, after, steps, shuffle=shuffle)
            assert sorted(used) == list(range(samples)), f"{samples} samples, batch {batch}, stopped at {steps}"
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 4)])
def test_split_batches_and_drop_last_resume_without_repeats(before, after) -> None:
    for steps in range(1, 5):
        used = _resume(50, 12, before, after, steps, shuffle=True, split=True)
        assert sorted(used) == list(range(50))
        used = _resume(50, 3, before, after, steps, shuffle=True, drop_last=True)
        assert len(used) == len(set(used)), f"a sample used twice after {steps} steps"


def test_a_state_that_used_the_whole_epoch_loads_as_the_next_epoch() -> None:
    # 16 batches of 3; 7 steps on 2 processes leave 2 batches: with drop_last, too few for a step of 3.
    first = _world(50, 2, 3, shuffle=True, drop_last=True)
    iterators = [iter(loader) for loader in first]
    for _ in range(7):
        for it in iterators:
            next(it)
    second = _world(50, 3, 3, shuffle=True, drop_last=True)
    second[0].load_state_dict(first[0].state_dict())
    assert (second[0].epoch, second[0].state_dict()["batches_yielded"]) == (1, 0)
    assert len(second[0]) == len(list(second[0])) == 5


@pytest.mark.parametrize("steps", [2, 3])
def test_an_old_state_without_stream_batches_still_resumes(steps) -> None:
    # States written before stream_batches existed: the position times the saved world gives it.
    used = _resume(40, 2, 2, 3, steps, shuffle=True, forget=("stream_batches",))
    assert sorted(used) == list(range(40))


@pytest.mark.parametrize(("before", "after", "stop"), [(3, 2, 3), (2, 3, 4)], ids=["3-to-2", "2-to-3"])
def test_processes_resume_a_checkpoint_at_another_world_size(tmp_path, launch, before, after, stop) -> None:
    """Real processes: save_state every step on one world, load_state and finish on another."""
    project = tmp_path / "project"
    reports = []
    for nprocs, args in ((before, ("stop", str(stop))), (after, ("resume",)), (1, ("load",))):
        out = tmp_path / f"out-{len(reports)}"
        out.mkdir()
        launch("world_change_worker.py", nprocs, str(out), str(project), *args)
        reports.append([json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)])
    first, second, loaded = (ranks[0] for ranks in reports)
    assert (first["world"], second["world"], len(first["steps"])) == (before, after, stop)
    for epoch in range(2):
        used = [i for at, gathered in first["steps"] + second["steps"] if at == epoch for i in gathered]
        assert sorted(used) == list(range(61)), f"epoch {epoch}: {len(used)} indices, {len(set(used))} distinct"
    # Every rank gathered the same indices, and the final checkpoint loads where the run ended.
    assert all(rank["steps"] == second["steps"] for rank in reports[1])
    assert loaded["weights"] == second["weights"]
