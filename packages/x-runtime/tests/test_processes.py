"""Process helpers on real processes: shares, decorators, triggers, two accelerators at once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def three(tmp_path_factory, launch) -> list[dict]:
    import json

    out = tmp_path_factory.mktemp("mixed")
    launch("mixed_worker.py", 3, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]


def test_plain_torchrun_without_launcher_forms_one_world(three) -> None:
    assert [r["world"] for r in three] == [3, 3, 3]
    assert [r["rank"] for r in three] == [0, 1, 2]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only default")
def test_accelerator_without_cpu_flag_joins_the_world_on_a_cpu_only_machine(three) -> None:
    # Accelerate 1.15 trains each rank alone here unless told cpu=True.
    assert [(r["plain_world"], r["plain_type"]) for r in three] == [(3, "MULTI_CPU")] * 3


def test_two_accelerators_keep_their_own_settings(three) -> None:
    assert all(r["first_steps"] == 1 and r["second_steps"] == 3 for r in three)


def test_split_between_processes_deals_contiguous_shares(three) -> None:
    assert [r["share"] for r in three] == [[0, 1, 2], [3, 4], [5, 6]]
    assert three[0]["padded"] == [0, 1, 2, 3, 4, 4, 5, 6, 6]
    assert [r["dict_share"] for r in three] == [{"a": [1], "b": ["x"]}, {"a": [2], "b": ["y"]}, {"a": [3], "b": ["z"]}]


def test_decorators_run_on_the_chosen_process_only(three) -> None:
    assert [r["on_main"] for r in three] == ["ran", None, None]
    assert [r["on_last"] for r in three] == [None, None, "ran"]
    assert [r["on_1"] for r in three] == [None, "ran", None]


def test_collectives_through_the_accelerator(three) -> None:
    assert all(r["reduce_sum"] == 6.0 and r["reduce_mean"] == 2.0 for r in three)
    assert [r["pad"] for r in three] == [[1, -1, -1], [1, 1, -1], [1, 1, 1]]


def test_trigger_set_on_one_process_is_seen_everywhere_once(three) -> None:
    assert all(r["trigger"] is True and r["trigger_again"] is False for r in three)
    assert all(r["trigger_second"] is False for r in three)


def test_a_new_accelerator_after_end_training_joins_the_same_group(three) -> None:
    # DDP averages the gradients (rank+1) * ones over 3 ranks: mean of 1, 2, 3 is 2.
    assert all(r["after_end_training_grad"] == [[2.0, 2.0]] for r in three)
