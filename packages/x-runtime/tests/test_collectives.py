"""x_runtime.process.collectives: identity on one process, real gloo collectives on 2 and 3 processes.

Launching torchrun costs seconds, so ``workers/collectives_worker.py`` runs every scenario in one
launch per world size and the tests below read its per-rank reports (cached for the module).
"""

from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import x_runtime.process.collectives as c

WORKER = Path(__file__).parent / "workers" / "collectives_worker.py"
_spec = importlib.util.spec_from_file_location("collectives_worker", WORKER)
assert _spec is not None and _spec.loader is not None
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)
encode = worker.encode
Pair = worker.Pair

_REPORTS: dict[int, list[dict]] = {}


@pytest.fixture
def reports(workers):
    """Per-rank reports of one worker run on ``n`` processes (launched once per module run)."""

    def get(n: int) -> list[dict]:
        if n not in _REPORTS:
            _REPORTS[n] = workers(WORKER, n)
        return _REPORTS[n]

    return get


def ok(report: dict, name: str):
    entry = report[name]
    assert "ok" in entry, f"{name} raised {entry.get('error')}: {entry.get('message')}"
    return entry["ok"]


worlds = pytest.mark.parametrize("world", [2, 3])


# --- one process -------------------------------------------------------------------------------


def test_doctests_pass() -> None:
    result = doctest.testmod(c)
    assert result.failed == 0 and result.attempted > 0


def test_helpers_without_distributed() -> None:
    assert not dist.is_initialized()
    assert (c.world_size(), c.rank()) == (1, 0)


def test_single_process_gather_returns_inputs_with_scalars_as_rows() -> None:
    x, scalar = torch.arange(3), torch.tensor(2.0)
    out = c.gather({"x": x, "p": Pair(x=scalar, y=[x])})
    assert out["x"] is x and out["p"].y[0] is x
    assert isinstance(out["p"], Pair)
    assert out["p"].x.shape == (1,) and out["p"].x.item() == 2.0


def test_single_process_rejects_non_tensor_leaves_like_many_processes() -> None:
    with pytest.raises(TypeError, match=r"str at data\['label'\]"):
        c.gather({"x": torch.ones(1), "label": "cat"})
    with pytest.raises(TypeError, match="NoneType at the top level"):
        c.pad_across_processes(None)
    with pytest.raises(TypeError):
        c.reduce([torch.ones(1), 3])


def test_single_process_gather_object_wraps_non_lists() -> None:
    items = [1, 2]
    assert c.gather_object(items) == [1, 2] and c.gather_object(items) is not items
    assert c.gather_object((1, 2)) == [(1, 2)]
    assert c.gather_object("ab") == ["ab"]


def test_single_process_pad_is_identity() -> None:
    data = {"x": torch.ones(2, 3)}
    assert c.pad_across_processes(data, dim=1, pad_index=-1, pad_first=True) is data


def test_single_process_reduce_copies_and_scales() -> None:
    x = torch.tensor([1.0, 2.0])
    for how in ("sum", "mean", "max", "min", "none"):
        out = c.reduce(x, reduction=how)
        assert torch.equal(out, x) and out is not x
    assert torch.equal(c.reduce({"x": x}, scale=3.0)["x"], torch.tensor([3.0, 6.0]))
    assert c.reduce(torch.tensor([4]), reduction="mean").dtype == torch.float32  # as on N processes
    assert c.reduce(torch.tensor([4])).dtype == torch.int64  # scale 1.0 keeps integers integers
    assert torch.equal(x, torch.tensor([1.0, 2.0]))


def test_reduce_rejects_unknown_reduction_listing_choices() -> None:
    with pytest.raises(ValueError, match="'sum', 'mean', 'max', 'min', 'none'"):
        c.reduce(torch.ones(1), reduction="avg")


def test_single_process_broadcast_validates_source() -> None:
    data = [torch.ones(2)]
    assert c.broadcast(data) is data
    for bad in (1, -1, True, "0", 0.0):
        with pytest.raises(ValueError, match=r"from_process must be a rank in \[0, 1\)"):
            c.broadcast(data, from_process=bad)
    items = ["a", None]
    assert c.broadcast_object_list(items) is items and items == ["a", None]
    with pytest.raises(ValueError, match="broadcast_object_list"):
        c.broadcast_object_list(items, from_process=2)


def test_initialized_world_of_one_matches_uninitialized_and_communicates_nothing(tmp_path, monkeypatch) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for name in ("all_gather", "all_gather_object", "all_reduce", "broadcast", "broadcast_object_list"):
            monkeypatch.setattr(dist, name, lambda *a, _name=name, **k: pytest.fail(f"{_name} called"))
        assert (c.world_size(), c.rank()) == (1, 0)
        assert torch.equal(c.gather(torch.tensor(5)), torch.tensor([5]))
        assert c.gather_object({"a": 1}) == [{"a": 1}]
        assert torch.equal(c.reduce(torch.tensor([2.0]), "mean", scale=2.0), torch.tensor([4.0]))
        assert c.broadcast_object_list([1]) == [1]
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()


# --- many processes: gather --------------------------------------------------------------------


@worlds
def test_reports_rank_and_world_size(reports, world) -> None:
    assert [ok(rep, "helpers") for rep in reports(world)] == [{"rank": r, "world_size": world} for r in range(world)]


@worlds
def test_first_gather_concatenates_in_rank_order_with_one_header_and_one_data_collective(reports, world) -> None:
    expected = {
        "a": torch.cat([torch.arange(4) + 10 * r for r in range(world)]),
        "b": [
            torch.cat([torch.arange(6, dtype=torch.float32).reshape(2, 3) + r for r in range(world)]),
            (torch.tensor([r * 1.5 for r in range(world)]),),
        ],
        "nt": Pair(
            x=torch.tensor([v for r in range(world) for v in (r % 2 == 0, True)]),
            y=torch.tensor([[r, -r] for r in range(world)]),
        ),
    }
    for r, rep in enumerate(reports(world)):
        assert ok(rep, "gather_nested") == {"result": encode(expected), "calls": {"all_gather": 2}}
        assert ok(rep, "gather_nested_inputs_after")["dict"]["a"]["tensor"] == [10 * r + i for i in range(4)]


@worlds
def test_gather_accepts_different_sizes_along_dim_0(reports, world) -> None:
    expected = {"u": torch.cat([torch.full((r + 1, 2), r) for r in range(world)]), "e": torch.arange(world)}
    empty_first = torch.ones(2 * (world - 1), 3)
    for rep in reports(world):
        # The second gather on the group: header and data in one collective.
        assert ok(rep, "gather_uneven") == {"result": encode(expected), "calls": {"all_gather": 1}}
        assert ok(rep, "gather_empty_rows") == encode(empty_first)


@worlds
def test_gather_treats_0d_tensors_as_one_row(reports, world) -> None:
    for rep in reports(world):
        assert ok(rep, "gather_scalar") == encode(torch.arange(world, dtype=torch.float32))


@worlds
def test_gather_moves_every_dtype_unchanged(reports, world) -> None:
    rs = range(world)
    expected = {
        "bool": torch.tensor([v for r in rs for v in (r % 2 == 0, True)]),
        "int64": torch.tensor([2**40 + r for r in rs]),
        "float16": torch.tensor([r + 0.5 for r in rs], dtype=torch.float16),
        "bfloat16": torch.tensor([r + 0.25 for r in rs], dtype=torch.bfloat16),
        "int16": torch.tensor([-r for r in rs], dtype=torch.int16),  # not a gloo type: travels as float16 bits
        "float8": torch.tensor([r + 1.0 for r in rs]).to(torch.float8_e4m3fn),
        "complex64": torch.tensor([complex(r, -r) for r in rs], dtype=torch.complex64),
    }
    for rep in reports(world):
        assert ok(rep, "gather_dtypes") == encode(expected)


@worlds
def test_later_gathers_fold_header_and_data_into_one_collective_and_grow_when_outgrown(reports, world) -> None:
    for rep in reports(world):
        again = ok(rep, "gather_fold_again")
        assert again["calls"] == {"all_gather": 1}
        assert again["result"] == ok(rep, "gather_nested")["result"]
        grows = ok(rep, "gather_fold_grows")
        assert grows["calls"] == {"all_gather": 2}  # headers say it does not fit: the data follows
        assert grows["result"] == encode(torch.cat([torch.full((500 + r, 3), float(r)) for r in range(world)]))
        grown = ok(rep, "gather_fold_grown")
        assert grown["calls"] == {"all_gather": 1}
        assert grown["result"] == encode(torch.cat([torch.full((400, 3), float(r)) for r in range(world)]))
        overflow = ok(rep, "gather_fold_header_overflows")
        # 40 tensors: the header outgrows its 32 reserved words, so headers go again, then the data.
        assert overflow["calls"] == {"all_gather": 3}
        assert overflow["result"] == encode(
            [torch.cat([torch.full((1,), i + r) for r in range(world)]) for i in range(40)]
        )


@worlds
def test_folded_gathers_of_views_and_tensors_with_history_carry_values_not_history(reports, world) -> None:
    rs = range(world)
    for rep in reports(world):
        views = ok(rep, "gather_fold_views")
        expected = {
            "t": torch.cat([(torch.arange(6.0).reshape(2, 3) + r).t() for r in rs]),
            "c": torch.tensor([complex(1, -r) for r in rs]),
            "g": torch.cat([torch.full((2,), r + 1.0) for r in rs]),
        }
        assert views == {
            "result": worker.encode({"got": expected, "requires_grad": [False, False, False]}),
            "calls": {"all_gather": 1},
        }
        history = ok(rep, "gather_fold_history")
        assert history == {
            "result": worker.encode(
                {"got": torch.cat([torch.full((3,), r + 1.0) for r in rs]), "requires_grad": False}
            ),
            "calls": {"all_gather": 1},
        }


@worlds
def test_gather_large_tensors_one_by_one_with_padding_trimmed(reports, world) -> None:
    rows = [300 + 7 * r for r in range(world)]
    for rep in reports(world):
        got = ok(rep, "gather_big")
        assert got["shapes"] == {"uneven": [sum(rows), 1000], "even": [300 * world, 1000], "flags": [2_000_000 * world]}
        assert got["uneven_rows"] == [float(r) for r in range(world) for _ in range(rows[r])]
        assert got["uneven_rows_constant"]
        assert got["even_sums"] == [r * 300_000 for r in range(world)]
        assert got["flags_true"] == 2_000_000 * (world // 2) and got["flags_dtype"] == "torch.bool"


@worlds
def test_gather_structure_too_large_for_first_metadata_round_takes_a_second(reports, world) -> None:
    expected = [torch.cat([torch.full((2,), i + r) for r in range(world)]) for i in range(100)]
    for rep in reports(world):
        assert ok(rep, "gather_many") == {"result": encode(expected), "calls": {"all_gather": 3}}


# --- many processes: the shape check raises everywhere, and the group stays usable ------------


def _error(rep: dict, name: str) -> tuple[str, str]:
    entry = rep[name]
    assert "error" in entry, f"{name} did not raise: {entry}"
    return entry["error"], entry["message"]


@worlds
def test_shape_mismatch_beyond_dim_0_raises_on_every_rank_naming_shapes(reports, world) -> None:
    shapes = "rank 0 (4, 3), rank 1 (4, 5)" if world == 2 else "ranks 0, 2 (4, 3), rank 1 (4, 5)"
    message = (
        f"gather: shapes differ across processes beyond dim 0: {shapes}; "
        "pad them with pad_across_processes or make them agree"
    )
    nested = ", ".join(f"rank {r} (2, {2 + r})" for r in range(world))
    for rep in reports(world):
        assert _error(rep, "mismatch_shape") == ("DistributedOperationException", message)
        error, text = _error(rep, "mismatch_shape_nested")
        assert error == "DistributedOperationException"
        assert text.startswith(f"gather: shapes differ across processes beyond dim 0 at data['y'][0]: {nested};")
        # Every rank left the failed gather in step: the next collective works.
        assert ok(rep, "after_mismatch") == encode(torch.arange(world))


@worlds
def test_dtype_mismatch_raises_on_every_rank(reports, world) -> None:
    others = "rank 1" if world == 2 else "ranks 1-2"
    message = (
        f"gather: dtypes differ across processes: rank 0 torch.float32, {others} torch.int64; cast them to one dtype"
    )
    for rep in reports(world):
        assert _error(rep, "mismatch_dtype") == ("DistributedOperationException", message)


@worlds
def test_structure_and_leaf_mismatches_raise_on_every_rank(reports, world) -> None:
    others = "rank 1" if world == 2 else "ranks 1-2"
    structure = (
        f"gather: the nested structure differs across processes: rank 0 [data['a']], {others} [data['a'], data['b']]; "
        "every process must pass the same containers, keys and lengths"
    )
    leaf = "gather: expected tensors or nested lists/tuples/dicts of tensors; rank 1 has str at data['b']"
    for rep in reports(world):
        assert _error(rep, "mismatch_structure") == ("DistributedOperationException", structure)
        assert _error(rep, "mismatch_leaf") == ("TypeError", leaf)


# --- many processes: gather_object, pad, reduce, broadcast ---------------------------------------


@worlds
def test_gather_object_concatenates_lists_and_wraps_anything_else(reports, world) -> None:
    for rep in reports(world):
        assert ok(rep, "gather_object_list") == [v for r in range(world) for v in (f"r{r}", r)]
        assert ok(rep, "gather_object_other") == [{"rank": r} for r in range(world)]
        assert ok(rep, "gather_object_tuple") == [[r, r] for r in range(world)]  # JSON turned tuples into lists


@worlds
def test_pad_across_processes_end_start_and_other_dims(reports, world) -> None:
    for r, rep in enumerate(reports(world)):
        values = list(range(1, r + 2))
        padding = [-1] * (world - 1 - r)
        assert ok(rep, "pad_end") == {
            "result": encode(torch.tensor(values + padding)),
            "calls": {"all_gather": 1},
        }
        assert ok(rep, "pad_first") == encode(torch.tensor(padding + values))
        m = torch.zeros(2, world, dtype=torch.int64)
        m[:, : r + 1] = 1
        assert ok(rep, "pad_dim1") == encode({"m": m, "s": torch.tensor(5.0), "v": torch.ones(3)})
        n = torch.zeros(2, world)
        n[:, world - (r + 1) :] = 1
        assert ok(rep, "pad_dim_neg") == encode([n])
        error, text = _error(rep, "pad_ndim_mismatch")
        assert (
            error == "DistributedOperationException"
            and "different numbers of dimensions" in text
            and "rank 0 (2,)" in text
        )


@worlds
def test_reduce_sum_mean_none_max_min_scale_leave_inputs_alone(reports, world) -> None:
    total = sum(range(1, world + 1))
    for r, rep in enumerate(reports(world)):
        mine = {"f": torch.tensor([1.0, 2.0]) * (r + 1), "i": torch.tensor([r + 1])}
        assert ok(rep, "reduce_sum") == encode({"f": torch.tensor([1.0, 2.0]) * total, "i": torch.tensor([total])})
        mean = total / world
        assert ok(rep, "reduce_mean") == encode({"f": torch.tensor([mean, 2 * mean]), "i": torch.tensor([mean])})
        assert ok(rep, "reduce_none") == encode(mine)
        assert ok(rep, "reduce_max") == encode({"f": torch.tensor([1.0, 2.0]) * world, "i": torch.tensor([world])})
        assert ok(rep, "reduce_min") == encode({"f": torch.tensor([1.0, 2.0]), "i": torch.tensor([1])})
        half = total * 0.5
        assert ok(rep, "reduce_sum_scale") == encode({"f": torch.tensor([half, 2 * half]), "i": torch.tensor([half])})
        assert ok(rep, "reduce_inputs_after") == encode(mine)
        assert _error(rep, "reduce_unknown")[0] == "ValueError"


@worlds
def test_broadcast_from_rank_1_in_place(reports, world) -> None:
    transposed = (torch.arange(6).reshape(2, 3) + 100).t()
    expected = {
        "a": torch.arange(3) + 100,
        "b": [torch.tensor(1.0), transposed],
        "bf16": torch.tensor([1.5], dtype=torch.bfloat16),
        "flag": torch.tensor([True]),
        "int16": torch.tensor([1], dtype=torch.int16),
        "param": torch.ones(2, 3),
    }
    for rep in reports(world):
        assert ok(rep, "broadcast") == {"same_object": True, "data": encode(expected), "transposed": encode(transposed)}
        error, text = _error(rep, "broadcast_bad_source")
        assert error == "ValueError" and f"[0, {world}), got {world}" in text
        assert ok(rep, "broadcast_object_list") == {"same_object": True, "items": [1, "x1", None]}


def test_prepare_shares_the_shuffle_seed_in_one_tensor_broadcast(inline_worker, workers) -> None:
    """The seedable sampler without data_seed: rank 0's draw reaches every rank in one int64 broadcast, nothing pickled; the
    broadcast is started by ``prepare`` and read on first use, so a collective the script makes in
    between still gets its own data, and a pickled or copied pending value is the number."""
    script = inline_worker(
        """
        import torch, torch.distributed as dist
        from _helpers import report
        from x_runtime import Accelerator, DataLoaderConfiguration
        from x_runtime.process.collectives import broadcast_int
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
        rank = accelerator.process_index
        torch.manual_seed(100 + rank)  # the ranks' draws differ: only the broadcast can make them agree
        calls = []
        for name in ("broadcast", "broadcast_object_list", "all_gather_object", "all_gather", "barrier"):
            real = getattr(dist, name)
            def counted(*args, _real=real, _name=name, **kwargs):
                calls.append(_name)
                return _real(*args, **kwargs)
            setattr(dist, name, counted)
        loader = torch.utils.data.DataLoader(list(range(40)), batch_size=4, shuffle=True)
        loader = accelerator.prepare(loader)
        made = list(calls)
        between = torch.tensor([float(rank + 1)])
        dist.all_reduce(between)  # issued while the seed may still be on its way
        from x_runtime.process.collectives.shared_int import share_int
        import copy, pickle
        pending = share_int(7 + rank)
        copied = [pickle.loads(pickle.dumps(pending)), copy.deepcopy(pending), int(pending)]
        order = [i for batch in loader for i in batch.tolist()]
        report({
            "between": between.item(),
            "copied": copied,
            "collectives": made,
            "seed": loader.state_dict()["seed"],
            "both": sorted(sum(accelerator.gather_for_metrics(torch.tensor(order)).view(2, -1).tolist(), [])),
            "from_1": broadcast_int(2**62 + rank, from_process=1),
        })
        """
    )
    first, second = workers(script, 2)
    assert first["collectives"] == second["collectives"] == ["broadcast"]
    assert first["seed"] == second["seed"]
    assert first["both"] == list(range(40))  # one shared order: the two ranks' halves make the dataset
    assert first["from_1"] == second["from_1"] == 2**62 + 1
    assert first["between"] == second["between"] == 3.0
    assert first["copied"] == second["copied"] == [7, 7, 7]
