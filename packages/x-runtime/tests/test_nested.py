"""Nested batches keep their container types through apply, slicing and device moves."""

from __future__ import annotations

import doctest
from collections import namedtuple

import torch

from x_runtime.core import nested

Pair = namedtuple("Pair", "inputs labels")


def test_doctests() -> None:
    assert doctest.testmod(nested).failed == 0


def test_apply_rebuilds_every_container_type() -> None:
    data = {"a": [torch.ones(1), (torch.zeros(1), "keep")], "p": Pair(torch.ones(2), torch.zeros(2))}
    out = nested.apply(lambda t: t + 1, data)
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple) and isinstance(out["p"], Pair)
    assert out["a"][1][1] == "keep" and out["p"].labels.tolist() == [1.0, 1.0]


def test_slice_batch_treats_plain_value_sequences_as_columns() -> None:
    # default_collate turns a string field into a tuple of strings: one per sample.
    batch = [torch.arange(4), ("a", "b", "c", "d"), {"ids": [1, 2, 3, 4]}]
    sliced = nested.slice_batch(batch, slice(1, 3))
    assert sliced[0].tolist() == [1, 2] and sliced[1] == ("b", "c") and sliced[2] == {"ids": [2, 3]}
    assert nested.slice_batch(Pair(torch.arange(3), torch.arange(3)), slice(0, 1)).labels.tolist() == [0]


def test_find_batch_size_and_send_to_device() -> None:
    data = {"scalar": torch.tensor(1.0), "x": torch.ones(5, 2)}
    assert nested.find_batch_size(data) == 5
    assert nested.find_batch_size(["no tensors"]) is None
    moved = nested.send_to_device(data, "cpu")
    assert moved["x"] is data["x"]  # already there: not copied
