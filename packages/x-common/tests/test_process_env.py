"""process_env: rank and rendezvous from torchrun's variables, SLURM's, or neither."""

from __future__ import annotations

import pytest

from x_common import env
from x_common.process_env import ProcessEnv, process_env

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "abc",
}

SLURM = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu-a[01-03,07]",
    "SLURM_NNODES": "4",
    "SLURM_NODEID": "2",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_TASKS_PER_NODE": "2(x4)",
}


def test_torchrun() -> None:
    result = process_env(TORCHRUN)
    assert result == ProcessEnv(
        rank=3,
        local_rank=1,
        world_size=8,
        local_world_size=2,
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=29500,
        source="torchrun",
    )
    assert result.is_distributed


def test_torchrun_minimal_fills_defaults() -> None:
    assert process_env({"RANK": "2", "WORLD_SIZE": "4"}) == ProcessEnv(2, 2, 4, 4, 0, "127.0.0.1", None, "torchrun")


def test_torchrun_single_process_is_not_distributed() -> None:
    result = process_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert result == ProcessEnv(0, 0, 1, 1, 0, "127.0.0.1", None, "torchrun")
    assert not result.is_distributed


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RANK": "0"}, "WORLD_SIZE is not set, but torch.distributed variables are; set it or unset the others"),
        ({"WORLD_SIZE": "2"}, "RANK is not set, but torch.distributed variables are; set it or unset the others"),
        (
            {"RANK": "", "WORLD_SIZE": "2"},
            "RANK is not set, but torch.distributed variables are; set it or unset the others",
        ),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"RANK": "9", "WORLD_SIZE": "4"}, "RANK=9 is not below WORLD_SIZE=4"),
        (
            {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "local rank 2 is not below local world size 2",
        ),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not valid: expected an integer >= 0"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is not valid: expected an integer >= 0"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not valid: expected an integer >= 1"),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not valid: expected an integer from 0 to 65535"),
    ],
)
def test_torchrun_contradictions(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        process_env(environ)
    assert str(excinfo.value) == message


def test_slurm() -> None:
    result = process_env(SLURM)
    assert result == ProcessEnv(
        rank=5,
        local_rank=1,
        world_size=8,
        local_world_size=2,
        node_rank=2,
        master_addr="gpu-a01",  # first host of the allocation
        master_port=23456,  # port_for_job(123456)
        source="slurm",
    )


def test_slurm_master_port_and_addr_override() -> None:
    result = process_env({**SLURM, "MASTER_PORT": "29400", "MASTER_ADDR": "head"})
    assert (result.master_addr, result.master_port) == ("head", 29400)


def test_slurm_uneven_tasks_per_node() -> None:
    environ = {**SLURM, "SLURM_TASKS_PER_NODE": "3,1", "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_NODEID": "1"}
    environ["SLURM_LOCALID"] = "0"
    result = process_env(environ)
    assert (result.rank, result.local_rank, result.world_size, result.local_world_size, result.node_rank) == (
        3,
        0,
        4,
        1,
        1,
    )


def test_slurm_minimal() -> None:
    # without node list, task layout or job id: loopback, all tasks local, no port
    assert process_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) == ProcessEnv(
        1, 0, 2, 2, 0, "127.0.0.1", None, "slurm"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"SLURM_PROCID": "8"}, "SLURM_PROCID=8 is not below SLURM_NTASKS=8"),
        ({"SLURM_LOCALID": "2"}, "local rank 2 is not below local world size 2"),
        (
            {"SLURM_TASKS_PER_NODE": "2x4"},
            "invalid SLURM_TASKS_PER_NODE '2x4': bad item '2x4'; expected e.g. '2(x3),1'",
        ),
        ({"SLURM_JOB_NODELIST": "gpu[1-"}, "invalid SLURM node list 'gpu[1-': unbalanced '['"),
        ({"SLURM_PROCID": "five"}, "SLURM_PROCID='five' is not valid: expected an integer >= 0"),
        ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not valid: expected an integer >= 0"),
    ],
)
def test_slurm_contradictions(changes: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        process_env({**SLURM, **changes})
    assert str(excinfo.value) == message


def test_slurm_node_id_beyond_task_list_is_a_value_error() -> None:
    # SLURM_NODEID=3 but SLURM_TASKS_PER_NODE names only two hosts: a contradiction, which the
    # docstring promises as ValueError naming the variables, not an IndexError.
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "1(x2)"}
    with pytest.raises(ValueError, match=r"SLURM_NODEID|SLURM_TASKS_PER_NODE"):
        process_env(environ)


def test_torch_variables_win_over_slurm() -> None:
    result = process_env({**SLURM, **TORCHRUN})
    assert result.source == "torchrun"
    assert (result.rank, result.world_size, result.master_addr, result.master_port) == (3, 8, "10.0.0.1", 29500)


def test_torch_world_size_alone_still_selects_torch() -> None:
    with pytest.raises(ValueError, match=r"^RANK is not set"):
        process_env({**SLURM, "WORLD_SIZE": "8"})


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"SLURM_PROCID": "0"},  # srun variables incomplete
        {"SLURM_NTASKS": "4"},
        {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]"},  # inside salloc, not a task
        {"RANK": "", "WORLD_SIZE": " "},  # empty counts as unset
        {"LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.9"},
    ],
)
def test_single_process(environ: dict[str, str]) -> None:
    result = process_env(environ)
    assert result == ProcessEnv(0, 0, 1, 1, 0, "127.0.0.1", None, "single")
    assert not result.is_distributed


def test_single_process_keeps_master_port() -> None:
    assert process_env({"MASTER_PORT": "12355"}).master_port == 12355


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in env.FOREIGN:
        monkeypatch.delenv(var.name, raising=False)
    assert process_env().source == "single"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert process_env() == ProcessEnv(1, 1, 3, 3, 0, "127.0.0.1", None, "torchrun")
