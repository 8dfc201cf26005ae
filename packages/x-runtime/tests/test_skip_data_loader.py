"""Accelerate's SkipDataLoader, IterableDatasetShard and DataLoaderStateMixin, and the stateful look:
a loader made with ``use_stateful_dataloader=True`` is an instance of torchdata's StatefulDataLoader."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from x_runtime import (
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    IterableDatasetShard,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from x_runtime.core.imports import is_torchdata_stateful_dataloader_available
from x_runtime.data.samplers import BatchSamplerShard

needs_torchdata = pytest.mark.skipif(not is_torchdata_stateful_dataloader_available(), reason="needs torchdata")


def _values(loader: object) -> list[list[int]]:
    return [batch.tolist() for batch in loader]  # type: ignore[attr-defined]


# --- SkipDataLoader ----------------------------------------------------------------------------


def test_skip_data_loader_drops_the_first_batches_of_every_epoch() -> None:
    loader = SkipDataLoader(list(range(16)), batch_size=4, skip_batches=2)
    assert _values(loader) == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert _values(loader) == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert len(loader) == 2 and type(loader) is SkipDataLoader
    assert isinstance(loader, DataLoader) and isinstance(loader, DataLoaderStateMixin)
    assert loader.base_dataloader is loader
    with pytest.raises(AttributeError):
        _ = SkipDataLoader.base_dataloader


def test_skip_data_loader_registers_with_its_gradient_state_while_iterating() -> None:
    loader = SkipDataLoader(list(range(8)), batch_size=2, skip_batches=1)
    iterator = iter(loader)
    next(iterator)
    assert loader.gradient_state.active_dataloader is loader
    iterator.close()
    assert loader.gradient_state.active_dataloader is None


def test_skip_data_loader_without_state_has_none_to_save() -> None:
    with pytest.raises(RuntimeError, match="use_stateful_dataloader"):
        SkipDataLoader(list(range(8)), batch_size=2).state_dict()


def test_skip_data_loader_pickles_and_copies_as_itself() -> None:
    loader = SkipDataLoader(list(range(8)), batch_size=2, skip_batches=3)
    for clone in (pickle.loads(pickle.dumps(loader)), copy.copy(loader), copy.deepcopy(loader)):
        assert type(clone) is SkipDataLoader
        assert _values(clone) == [[6, 7]]


@needs_torchdata
def test_stateful_skip_data_loader_is_a_stateful_dataloader_and_resumes() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = SkipDataLoader(list(range(16)), batch_size=2, skip_batches=2, use_stateful_dataloader=True)
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, SkipDataLoader)
    assert type(loader) is SkipDataLoader
    assert isinstance(loader.base_dataloader, StatefulDataLoader) and loader.base_dataloader is not loader
    batches = []
    for index, batch in enumerate(loader):
        batches.append(batch.tolist())
        if index == 1:
            state = loader.state_dict()
    assert batches == [[4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert state["_num_yielded"] == 4  # the two skipped batches count as handed out
    resumed = SkipDataLoader(list(range(16)), batch_size=2, skip_batches=2, use_stateful_dataloader=True)
    resumed.load_state_dict(state)
    assert _values(resumed) == batches[2:]  # skipped batches are not skipped a second time
    assert _values(resumed) == batches  # the next epoch skips again


@needs_torchdata
def test_stateful_skip_data_loader_state_is_torchdatas() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    reference = StatefulDataLoader(list(range(12)), batch_size=3)
    loader = SkipDataLoader(list(range(12)), batch_size=3, use_stateful_dataloader=True)
    for dl in (reference, loader):
        iterator = iter(dl)
        next(iterator), next(iterator)
    assert loader.state_dict() == reference.state_dict()


# --- the stateful look of prepared loaders ------------------------------------------------------


@needs_torchdata
@pytest.mark.parametrize("cls", [DataLoaderShard, DataLoaderDispatcher])
def test_stateful_prepared_loader_is_a_stateful_dataloader(cls: type) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = cls(list(range(8)), batch_size=2, use_stateful_dataloader=True)
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, cls)
    assert isinstance(loader, DataLoaderStateMixin) and isinstance(loader.base_dataloader, StatefulDataLoader)
    assert type(loader) is cls and loader.__class__ is StatefulDataLoader
    plain = cls(list(range(8)), batch_size=2)
    assert not isinstance(plain, StatefulDataLoader) and plain.__class__ is cls


@needs_torchdata
def test_prepared_stateful_loader_pickles_as_x_class() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2), use_stateful_dataloader=True)
    assert isinstance(loader, StatefulDataLoader)
    for clone in (pickle.loads(pickle.dumps(loader)), copy.copy(loader), copy.deepcopy(loader)):
        assert type(clone) is DataLoaderShard and isinstance(clone, StatefulDataLoader)
        assert _values(clone) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_class_can_still_be_assigned() -> None:
    class Mine(DataLoaderShard):
        pass

    loader = DataLoaderShard(list(range(4)), batch_size=2)
    loader.__class__ = Mine
    assert type(loader) is Mine


def test_loaders_without_stateful_dataloader_do_not_import_torchdata() -> None:
    code = (
        "import sys\n"
        "from torch.utils.data import DataLoader\n"
        "from x_runtime import SkipDataLoader, prepare_data_loader\n"
        "loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2))\n"
        "isinstance(loader, int); list(loader); list(SkipDataLoader(list(range(4)), skip_batches=1))\n"
        "assert 'torchdata' not in sys.modules, 'torchdata imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- iteration, split_batches message ---------------------------------------------------------


@pytest.mark.parametrize("cls", [DataLoaderShard, DataLoaderDispatcher])
def test_iteration_is_the_epoch_and_survives_skip_first_batches(cls: type) -> None:
    loader = cls(list(range(8)), batch_size=2)
    assert loader.iteration == 0
    loader.set_epoch(3)
    assert loader.iteration == 3 and skip_first_batches(loader, 1).iteration == 3
    loader.iteration = 5
    assert loader.epoch == 5
    list(loader)
    assert loader.iteration == 6


def test_split_batches_message_says_round_multiple() -> None:
    from torch.utils.data import BatchSampler

    with pytest.raises(ValueError, match="round multiple"):
        BatchSamplerShard(BatchSampler(range(20), batch_size=3, drop_last=False), 2, 0, split_batches=True)


# --- IterableDatasetShard ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"batch_size": 2}, [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 0]]),
        ({"batch_size": 2, "drop_last": True}, [[0, 1, 4, 5], [2, 3, 6, 7]]),
        ({"batch_size": 4, "split_batches": True}, [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 0]]),
        ({"batch_size": 4, "split_batches": True, "drop_last": True}, [[0, 1, 4, 5], [2, 3, 6, 7]]),
    ],
)
def test_iterable_dataset_shard_deals_and_completes(kwargs: dict[str, object], expected: list[list[int]]) -> None:
    shards = [IterableDatasetShard(range(11), num_processes=2, process_index=i, **kwargs) for i in (0, 1)]  # type: ignore[arg-type]
    assert [list(shard) for shard in shards] == expected
    assert [len(shard) for shard in shards] == [len(e) for e in expected]


def test_iterable_dataset_shard_checks_split_and_passes_the_epoch() -> None:
    with pytest.raises(ValueError, match="round multiple"):
        IterableDatasetShard(range(4), batch_size=3, num_processes=2, split_batches=True)

    class Epochs(torch.utils.data.IterableDataset):
        epoch = -1

        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(4))

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    data = Epochs()
    shard = IterableDatasetShard(data, batch_size=2)
    shard.set_epoch(4)
    assert data.epoch == 4 and list(shard) == [0, 1, 2, 3]
