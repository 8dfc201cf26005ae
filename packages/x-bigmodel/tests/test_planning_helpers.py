"""``infer_auto_device_map(fallback_allocation=...)``, ``clean_device_map`` and
``get_module_size_with_ties``."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from x_bigmodel import clean_device_map, get_module_size_with_ties, infer_auto_device_map


def _plan(model: nn.Module, **kwargs: object) -> dict[str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPU 0 named in max_memory on a machine without one
        return infer_auto_device_map(model, **kwargs)  # type: ignore[arg-type]


def test_fallback_allocation_fills_a_device_the_next_module_does_not_fit() -> None:
    # Linear(20, 20): 1680 bytes; Linear(2, 2): 24 bytes. GPU 0 keeps 1680 free for the largest
    # layer to come (things are offloaded), leaving 30 bytes: no room for module 0, but for 1.
    model = nn.Sequential(nn.Linear(20, 20), nn.Linear(2, 2), nn.Linear(20, 20), nn.Linear(2, 2))
    budgets = {0: 1710, "cpu": 10_000}
    assert _plan(model, max_memory=budgets) == {"": "cpu"}
    assert _plan(model, max_memory=budgets, fallback_allocation=True) == {"0": "cpu", "1": 0, "2": "cpu", "3": "cpu"}


def test_fallback_allocation_changes_nothing_when_the_model_fits() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear1 = nn.Linear(10, 10)
            self.linear2 = nn.Linear(10, 10)
            self.linear2.weight = self.linear1.weight

    assert _plan(Tied(), max_memory={0: 600}, fallback_allocation=True) == {"": 0}


def test_fallback_allocation_places_nothing_that_does_not_fit() -> None:
    model = nn.Sequential(nn.Linear(20, 20), nn.Linear(20, 20))
    assert _plan(model, max_memory={0: 100, "cpu": 10_000}, fallback_allocation=True) == {"": "cpu"}


def test_clean_device_map_regroups_in_place() -> None:
    device_map = {"a.x": 0, "a.y": 0, "b.x.0": 1, "b.x.1": 1, "b.y.0": 2, "b.y.1": 2, "c": 2}
    assert clean_device_map(device_map) is device_map
    assert device_map == {"a": 0, "b.x": 1, "b.y": 2, "c": 2}
    assert clean_device_map({"a": "cpu", "b": "cpu"}) == {"": "cpu"}
    only_b = clean_device_map({"a.x": 0, "a.y": 1, "b.x": 1, "b.y": 1}, module_name="b")
    assert only_b == {"a.x": 0, "a.y": 1, "b": 1}


def test_get_module_size_with_ties_counts_each_tied_module_once() -> None:
    model = nn.ModuleList([nn.Linear(4, 4) for _ in range(12)])
    for i in range(1, 12):
        model[i].weight = model[0].weight
    weight, bias = 4 * 4 * 4, 4 * 4
    sizes = {f"{i}": weight + bias for i in range(12)} | {f"{i}.weight": weight for i in range(12)}
    to_treat = list(model.named_children())[1:]
    tied = ["1.weight", "10.weight", "11.weight"]
    size, names, modules = get_module_size_with_ties(tied, weight + bias, sizes, to_treat)
    assert size == weight + bias + 3 * bias
    assert names == ["1", "10", "11"]
    assert modules == [model[1], model[10], model[11]]
    assert get_module_size_with_ties([], 7, sizes, to_treat) == (7, [], [])
    assert isinstance(modules[0].weight, torch.nn.Parameter)
