"""``debug_launcher``: the function runs in new CPU processes joined over gloo, never in the caller's."""

from __future__ import annotations

import os

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from x_runtime import debug_launcher


def _where(tag: str) -> tuple[str, int, int, str, str | None, int, str]:
    import torch.distributed as dist

    from x_runtime import PartialState

    state = PartialState()
    backend = dist.get_backend() if dist.is_initialized() else None
    return (
        tag,
        state.process_index,
        state.num_processes,
        str(state.device),
        backend,
        os.getpid(),
        os.environ["X_USE_CPU"],
    )


def _fails_on_rank_one() -> None:
    from x_runtime import PartialState

    if PartialState().process_index == 1:
        raise RuntimeError("rank one fails")


def test_two_processes_join_one_gloo_group_on_cpu() -> None:
    results = debug_launcher(_where, ("a",))
    assert sorted(results) == [0, 1]
    for rank, (tag, index, world, device, backend, pid, use_cpu) in results.items():
        assert (tag, index, world, device, backend, use_cpu) == ("a", rank, 2, "cpu", "gloo", "1")
        assert pid != os.getpid()
    assert results[0][5] != results[1][5]
    assert "X_USE_CPU" not in os.environ  # the caller's environment is as it was


def test_one_process_still_runs_elsewhere() -> None:
    results = debug_launcher(_where, ("b",), num_processes=1)
    (tag, index, world, device, backend, pid, _cpu) = results[0]
    assert (tag, index, world, device, backend) == ("b", 0, 1, "cpu", None) and pid != os.getpid()


def test_a_failing_rank_is_reported() -> None:
    with pytest.raises(ChildFailedError, match="rank one fails"):
        debug_launcher(_fails_on_rank_one, num_processes=2)


def test_num_processes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1, got 0"):
        debug_launcher(_where, ("c",), num_processes=0)
