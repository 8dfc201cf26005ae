"""Prepared dataloaders: sharding, padding, shuffling, bookkeeping and resuming, checked by value.

Every expectation comes from one model of the semantics (:func:`expected`), written on flat
sample lists: a global step is the next ``total_batch_size`` samples of the epoch's order; rank
``i`` gets the ``i``-th slice of it; an incomplete last step is dropped (``drop_last``), padded
from the start of the epoch (``even_batches``) or left short. Real ranks (gloo, 2 and 3
processes, one launch each) run the scenarios of ``workers/data_scenarios.py``; single-process
tests cover the rest, including every rank of a run simulated through ``process_index``.
"""

from __future__ import annotations

import doctest
import importlib.util
import itertools
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from x_runtime.data import samplers
from x_runtime.data.gradient_state import GradientState
from x_runtime.data.loader import loaders
from x_runtime.data.loader import prepare as data_loader
from x_runtime.data.loader.prepare import (
    DataLoaderDispatcher,
    DataLoaderShard,
    SeedableRandomSampler,
    prepare_data_loader,
    skip_first_batches,
)

TESTS = Path(__file__).parent


def expected(order: list[int], batch_size: int, processes: int, split: bool, even: bool, drop_last: bool):
    """Each rank's batches and the remainder, for a dataloader over ``order`` with ``batch_size``."""
    full = batch_size if split else batch_size * processes
    per_rank = batch_size // processes if split else batch_size
    used = order
    if drop_last:
        batches = len(order) // batch_size
        used = order[: (batches if split else batches // processes * processes) * batch_size]
    ranks: list[list[list[int]]] = [[] for _ in range(processes)]
    remainder = -1
    for start in range(0, len(used), full):
        step = used[start : start + full]
        remainder = len(step)
        if len(step) < full and even and processes > 1:
            step = step + list(itertools.islice(itertools.cycle(order), full - len(step)))
        for rank in range(processes):
            if chunk := step[rank * per_rank : (rank + 1) * per_rank]:
                ranks[rank].append(chunk)
    if processes > 1 and not even:
        remainder = -1
    return ranks, remainder


class Indexed(Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        return torch.tensor(index)


class Stream(IterableDataset):
    def __init__(self, size: int) -> None:
        self.size = size
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        return iter(range(self.size))


def values(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def flat(loader) -> list[int]:
    return [sample for batch in loader for sample in batch.tolist()]


# --- real processes -------------------------------------------------------------------------


def _run_workers():
    # conftest.run_workers is a plain function, not a fixture: load it to launch once per module.
    spec = importlib.util.spec_from_file_location("_x_runtime_tests_conftest", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_workers


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"{n}proc")
def ranks(request, tmp_path_factory) -> list[dict]:
    """What every rank of one ``data_scenarios.py`` launch on N processes reported."""
    processes = request.param
    out = tmp_path_factory.mktemp(f"data-{processes}")
    _run_workers()(TESTS / "workers" / "data_scenarios.py", processes, str(out))
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(processes)]
    return reports


def test_every_mode_gives_each_rank_its_share_of_the_global_order(ranks) -> None:
    processes = len(ranks)
    for key in ranks[0]["grid"]:
        _, size, split, even, drop_last = key.split("/")
        split_batches = split == "1"
        want, remainder = expected(
            list(range(int(size))), 6 if split_batches else 2, processes, split_batches, even == "1", drop_last == "1"
        )
        for rank, report in enumerate(ranks):
            got = report["grid"][key]
            assert got["batches"] == want[rank], (key, rank)
            assert got["len"] == len(want[rank]), (key, rank)
            assert got["ends"] == [False] * (len(want[rank]) - 1) + [True], (key, rank)
            assert got["remainder"] == remainder, (key, rank)


def test_even_batches_pad_from_the_start_and_remainder_cuts_the_padding(ranks) -> None:
    for key in ranks[0]["grid"]:
        _, size, split, even, drop_last = key.split("/")
        if even != "1" or drop_last != "0":
            continue
        grids = [report["grid"][key] for report in ranks]
        steps = {len(grid["batches"]) for grid in grids}
        assert len(steps) == 1, key  # every rank the same number of batches
        stream: list[int] = []
        for step in range(steps.pop()):
            together = [sample for grid in grids for sample in grid["batches"][step]]
            if split == "0":  # the step is underlying batches kP..kP+P-1, rank order
                assert all(len(grid["batches"][step]) == 2 for grid in grids), key
            stream.extend(together)
        real = len(stream) - (len(together) - grids[0]["remainder"])
        assert stream[:real] == list(range(int(size))), key
        assert stream[real:] == list(range(len(stream) - real)), key  # padding: the epoch's first samples


def test_shuffle_is_one_permutation_on_every_rank_equal_to_one_process(ranks) -> None:
    torch.manual_seed(1234)
    single = prepare_data_loader(DataLoader(Indexed(10), batch_size=2, shuffle=True), use_seedable_sampler=True)
    orders = [flat(single), flat(single)]
    assert orders[0] != orders[1] and sorted(orders[1]) == list(range(10))

    processes = len(ranks)
    shuffled = [report["shuffled"] for report in ranks]
    assert len({report["seed"] for report in shuffled}) == 1  # rank 0's draw, though ranks seeded differently
    assert shuffled[0]["seed"] == single.seed
    for epoch in (0, 1):
        want, _ = expected(orders[epoch], 2, processes, False, True, False)
        assert [report["epochs"][epoch] for report in shuffled] == want
    assert [report["again"] for report in shuffled] == [report["epochs"][0] for report in shuffled]
    assert {report["epoch_after"] for report in shuffled} == {1}


def test_gradient_state_tracks_the_loop_including_break(ranks) -> None:
    for report in ranks:
        for kind, found in report["bookkeeping"].items():
            seen = found["seen"]
            assert all(active for active, _, _ in seen), kind
            assert [end for _, end, _ in seen] == [False] * (len(seen) - 1) + [True], kind
            total = 2 * len(ranks)
            assert seen[-1][2] == (10 % total or total), kind
            assert not found["after"] and found["inside_before_break"] and not found["after_break"], kind
            assert found["end_after_break"] == (len(seen) == 2), kind  # the break came at batch 2
            if "dataset_epochs" in found:
                assert found["dataset_epochs"] == [0, 1]


def test_resume_yields_the_remaining_batches_then_the_next_epoch(ranks) -> None:
    processes = len(ranks)
    for rank, report in enumerate(ranks):
        found = report["resumed"]
        epochs = found["reference_epochs"]  # same seed, fresh loader: epochs 0, 1, 2
        assert found["state"]["epoch"] == 1 and found["state"]["batches_yielded"] == 2
        assert found["after_break_epoch"] == 1  # the abandoned epoch does not count
        assert found["epoch0"] == epochs[0]
        assert found["partial"] == epochs[1][:2]
        assert found["rest"] == epochs[1][2:]
        assert found["following"] == epochs[2]
        assert found["stateful_len"] == len(epochs[1])  # the epoch's length, as Accelerate's (not the rest)
        assert found["stateful_rest"] == epochs[1][2:]
        assert found["stateful_following"] == epochs[2]
        stream, _ = expected(list(range(10)), 2, processes, False, True, False)
        assert found["stream_state"]["batches_yielded"] == 1
        assert found["stream_rest"] == stream[rank][1:]
    assert len({json.dumps(report["resumed"]["state"]["seed"]) for report in ranks}) == 1


# --- one process, every rank simulated ------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 2, 3])
@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_simulated_ranks_match_the_model(processes: int, kind: str) -> None:
    for size, split, even, drop_last in itertools.product(
        (1, 4, 10, 12, 13), (False, True), (True, False), (False, True)
    ):
        batch_size = 6 if split else 2
        want, remainder = expected(list(range(size)), batch_size, processes, split, even, drop_last)
        for rank in range(processes):
            dataset = Indexed(size) if kind == "map" else Stream(size)
            loader = prepare_data_loader(
                DataLoader(dataset, batch_size=batch_size, drop_last=drop_last),
                num_processes=processes,
                process_index=rank,
                split_batches=split,
                even_batches=even,
                dispatch_batches=False,
            )
            case = (size, split, even, drop_last, rank)
            assert values(loader) == want[rank], case
            assert len(loader) == len(want[rank]), case
            if want[rank]:
                assert loader.remainder == remainder, case


def test_custom_batch_sampler_batches_are_dealt_round_robin() -> None:
    batches = [[0], [1, 2], [3, 4, 5], [6], [7, 8]]  # no batch_size: sizes vary
    for even, want in (
        (True, [[[0], [3, 4, 5], [7, 8]], [[1, 2], [6], [0]]]),
        (False, [[[0], [3, 4, 5], [7, 8]], [[1, 2], [6]]]),
    ):
        got = [
            values(
                prepare_data_loader(
                    DataLoader(Indexed(9), batch_sampler=batches), num_processes=2, process_index=r, even_batches=even
                )
            )
            for r in range(2)
        ]
        assert got == want


def test_batch_size_none_deals_single_samples_and_batch_sampler_as_sampler() -> None:
    loaders = [
        prepare_data_loader(DataLoader(Indexed(5), batch_size=None), num_processes=2, process_index=r) for r in range(2)
    ]
    assert [[item.item() for item in loader] for loader in loaders] == [[0, 2, 4], [1, 3, 0]]

    class Rows(Dataset):  # reads a whole batch of indices at once, as datasets.Dataset does
        def __len__(self) -> int:
            return 10

        def __getitem__(self, indices):
            return torch.tensor(indices)

    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=2, drop_last=False)
    got = [
        values(
            prepare_data_loader(DataLoader(Rows(), sampler=sampler, batch_size=None), num_processes=2, process_index=r)
        )
        for r in range(2)
    ]
    assert got == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_split_batches_needs_a_batch_size_the_processes_divide() -> None:
    with pytest.raises(ValueError, match=r"batch size \(4\).*processes \(3\)"):
        prepare_data_loader(DataLoader(Indexed(12), batch_size=4), num_processes=3, split_batches=True)
    with pytest.raises(ValueError, match=r"batch size \(4\).*processes \(3\)"):
        prepare_data_loader(DataLoader(Stream(12), batch_size=4), num_processes=3, split_batches=True)


def test_nested_iterable_batches_pad_every_field() -> None:
    class Named(IterableDataset):
        def __iter__(self):
            for index in range(5):
                yield {"x": torch.tensor([index, -index]), "pair": (torch.tensor(index), f"s{index}")}

    got = []
    for rank in range(2):
        loader = prepare_data_loader(
            DataLoader(Named(), batch_size=2), num_processes=2, process_index=rank, dispatch_batches=False
        )
        got.append([(batch["x"][:, 0].tolist(), batch["pair"][0].tolist(), batch["pair"][1]) for batch in loader])
        assert loader.remainder == 1
    # The short batch is completed from the start of the epoch, the missing one continues from there.
    assert got[0] == [([0, 1], [0, 1], ("s0", "s1")), ([4, 0], [4, 0], ("s4", "s0"))]
    assert got[1] == [([2, 3], [2, 3], ("s2", "s3")), ([1, 2], [1, 2], ("s1", "s2"))]


def test_attributes_describe_the_share_of_this_process() -> None:
    loader = prepare_data_loader(
        DataLoader(Indexed(12), batch_size=6, shuffle=True),
        num_processes=3,
        process_index=1,
        split_batches=True,
        use_seedable_sampler=True,
    )
    assert isinstance(loader, DataLoaderShard) and isinstance(loader, DataLoader)
    assert (loader.batch_size, loader.total_batch_size, len(loader)) == (2, 6, 2)
    assert isinstance(loader.sampler, SeedableRandomSampler) and isinstance(loader.sampler, RandomSampler)
    assert loader.epoch == 0
    iterable = prepare_data_loader(DataLoader(Stream(12), batch_size=3), num_processes=2, process_index=0)
    assert isinstance(iterable, DataLoaderDispatcher)
    assert (iterable.batch_size, iterable.total_batch_size, len(iterable)) == (3, 6, 2)
    with pytest.raises(ValueError, match="already prepared"):
        prepare_data_loader(loader)


def test_device_moves_batches() -> None:
    # "meta" is a real non-CPU device on every machine: the batch must land there, nested.
    loader = prepare_data_loader(
        DataLoader(Stream(4), batch_size=2, collate_fn=lambda b: {"x": torch.tensor(b)}), device="meta"
    )
    batches = list(loader)
    assert [batch["x"].device.type for batch in batches] == ["meta", "meta"]
    assert loader.end_of_dataloader and loader.remainder == 2
    assert next(iter(prepare_data_loader(DataLoader(Indexed(4), batch_size=2), device="cpu"))).device.type == "cpu"


def test_seed_comes_from_data_seed_or_the_global_rng_once() -> None:
    def order(**kwargs) -> list[int]:
        return flat(
            prepare_data_loader(
                DataLoader(Indexed(20), batch_size=4, shuffle=True), **kwargs, use_seedable_sampler=True
            )
        )

    assert order(data_seed=3) == order(data_seed=3) != order(data_seed=4)
    torch.manual_seed(5)
    first = order()
    torch.manual_seed(5)
    assert order() == first
    with_generator = DataLoader(Indexed(20), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(0)
    seed = prepare_data_loader(with_generator).seed
    again = DataLoader(Indexed(20), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(1)
    assert prepare_data_loader(again).seed == seed  # the loader's own generator decides, not the global RNG

    plain = prepare_data_loader(DataLoader(Indexed(8), batch_size=4, shuffle=True), use_seedable_sampler=False)
    assert type(plain.sampler) is RandomSampler and plain.seed is None


def test_workers_load_the_same_batches() -> None:
    def make(workers: int, **kwargs):
        return prepare_data_loader(
            DataLoader(Indexed(13), batch_size=2, shuffle=True, num_workers=workers, **kwargs),
            num_processes=2,
            process_index=1,
            data_seed=11,
            use_seedable_sampler=True,
        )

    reference = make(0)
    want = [values(reference), values(reference)]
    loader = make(2, persistent_workers=True)
    for epoch in range(2):
        got, ends = [], []
        for batch in loader:
            got.append(batch.tolist())
            ends.append(loader.end_of_dataloader)
        assert got == want[epoch]
        assert ends == [False] * (len(got) - 1) + [True]
        assert loader.remainder == 1  # 13 samples: the last step of 4 holds one real one
    # Workers read the sampler to its end ahead of the loop: a loop stopped early keeps its epoch.
    for _ in loader:
        break
    assert loader.epoch == 2


def test_state_dict_is_json_and_tracks_the_position() -> None:
    loader = prepare_data_loader(
        DataLoader(Indexed(10), batch_size=2, shuffle=True), data_seed=1, use_seedable_sampler=True
    )
    assert loader.state_dict() == {"epoch": 0, "seed": 1, "batches_yielded": 0, "num_processes": 1, "stream_batches": 0}
    for index, _ in enumerate(loader):
        if index == 2:
            assert json.loads(json.dumps(loader.state_dict()))["batches_yielded"] == 3
            assert loader.state_dict()["epoch"] == 0
            break
    assert loader.state_dict()["batches_yielded"] == 3
    list(loader)
    assert loader.state_dict()["batches_yielded"] == 0 and loader.epoch == 1


def test_skip_first_batches_shares_the_epoch_and_stacks() -> None:
    loader = prepare_data_loader(
        DataLoader(Indexed(10), batch_size=2, shuffle=True), data_seed=2, use_seedable_sampler=True
    )
    reference = prepare_data_loader(
        DataLoader(Indexed(10), batch_size=2, shuffle=True), data_seed=2, use_seedable_sampler=True
    )
    epochs = [values(reference), values(reference)]
    skipped = skip_first_batches(loader, 1)
    assert isinstance(skipped, DataLoaderShard) and len(skipped) == 4
    twice = skip_first_batches(skipped, 2)
    assert values(twice) == epochs[0][3:] and twice.state_dict()["batches_yielded"] == 0
    assert loader.epoch == 1 and values(loader) == epochs[1]

    restored = prepare_data_loader(
        DataLoader(Indexed(10), batch_size=2, shuffle=True), data_seed=9, use_seedable_sampler=True
    )
    restored.load_state_dict({"epoch": 0, "seed": 2, "batches_yielded": 4})
    rest = skip_first_batches(restored, 4)
    assert rest.state_dict()["seed"] == 2
    for index, batch in enumerate(rest):
        assert batch.tolist() == epochs[0][4 + index]
        assert restored.state_dict()["batches_yielded"] == 5 + index  # the original follows its copy
    assert (
        rest.state_dict()
        == restored.state_dict()
        == {"epoch": 1, "seed": 2, "batches_yielded": 0, "num_processes": 1, "stream_batches": 0}
    )


def test_skip_first_batches_on_plain_dataloaders() -> None:
    mapped = skip_first_batches(DataLoader(Indexed(7), batch_size=2), 2)
    assert type(mapped) is DataLoader and values(mapped) == [[4, 5], [6]] and len(mapped) == 2
    stream = skip_first_batches(DataLoader(Stream(7), batch_size=2), 3)
    assert isinstance(stream, DataLoader) and values(stream) == [[6]] and len(stream) == 1
    assert values(skip_first_batches(stream, 1)) == []


def test_set_epoch_reaches_sampler_and_dataset() -> None:
    stream = Stream(4)
    loader = prepare_data_loader(DataLoader(stream, batch_size=2), dispatch_batches=False)
    loader.set_epoch(5)
    list(loader)
    assert stream.epochs == [5, 5] and loader.epoch == 6
    shuffled = prepare_data_loader(
        DataLoader(Indexed(6), batch_size=2, shuffle=True), data_seed=0, use_seedable_sampler=True
    )
    shuffled.set_epoch(3)
    assert shuffled.sampler.epoch == 3


class EpochBatches:
    """A batch sampler of its own (no torch BatchSampler), whose order depends on its epoch."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size, self.epoch = n, size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        return iter([order[i : i + self.size] for i in range(0, self.n, self.size)])

    def __len__(self) -> int:
        return -(-self.n // self.size)


@pytest.mark.parametrize("processes", [1, 2])
def test_set_epoch_reaches_a_custom_batch_sampler(processes: int) -> None:
    # Accelerate's loaders call the batch sampler's own set_epoch; without it every epoch repeats one order.
    loader = prepare_data_loader(
        DataLoader(Indexed(12), batch_sampler=EpochBatches(12, 3)), num_processes=processes, process_index=0
    )
    orders = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        orders.append([row for batch in loader for row in batch.tolist()])
    assert len({tuple(order) for order in orders}) == 3
    for epoch, order in enumerate(orders):  # rank 0's batches of that epoch's order: the 1st, then every world-th
        sampler = EpochBatches(12, 3)
        sampler.set_epoch(epoch)
        mine = [batch for i, batch in enumerate(sampler) if i % processes == 0]
        assert order == [row for batch in mine for row in batch], epoch


def test_dispatch_over_several_processes_needs_torch_distributed() -> None:
    loader = prepare_data_loader(DataLoader(Stream(4), batch_size=2), num_processes=2, process_index=0)
    with pytest.raises(RuntimeError, match=r"torch\.distributed"):
        list(loader)


def test_docstring_examples_run() -> None:
    for module in (data_loader, loaders, samplers):
        assert doctest.testmod(module).failed == 0


def test_gradient_state_is_released_by_an_abandoned_loop() -> None:
    state = GradientState()
    loader = prepare_data_loader(DataLoader(Indexed(6), batch_size=2), gradient_state=state)
    iterator = iter(loader)
    next(iterator)
    assert state.active_dataloader is loader and not state.end_of_dataloader
    del iterator
    assert not state.in_dataloader
