"""SLURM's compressed node and task lists, and the job's rendezvous port."""

from __future__ import annotations

import re

import pytest

from x_common.slurm import expand_nodelist, expand_tasks_per_node, first_host, port_for_job


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("n1", ["n1"]),
        ("  n1  ", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[3]", ["n3"]),
        ("n[5-5]", ["n5"]),
        ("gpu-a[01-03,07],gpu-b12", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07", "gpu-b12"]),
        ("node[08-10]", ["node08", "node09", "node10"]),  # padding of the lower bound carries over
        ("node[098-101]", ["node098", "node099", "node100", "node101"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("r[1-2]n[1,3]-ib", ["r1n1-ib", "r1n3-ib", "r2n1-ib", "r2n3-ib"]),
        ("a[1-2]b[3]c[4-5]", ["a1b3c4", "a1b3c5", "a2b3c4", "a2b3c5"]),
        ("[1-2]", ["1", "2"]),
        ("login1,node[3-4],n[1-2]", ["login1", "node3", "node4", "n1", "n2"]),
        ("n[1,1]", ["n1", "n1"]),  # kept as written
        ("10.0.0.1", ["10.0.0.1"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    ("nodelist", "problem"),
    [
        ("n[1-3", "unbalanced '['"),
        ("n[1-3],m[2", "unbalanced '['"),
        ("n1-3]", "unbalanced ']'"),
        ("n]1[", "unbalanced ']'"),
        ("n[1-3]]", "unbalanced ']'"),
        ("n[3-1]", "range '3-1' goes down"),
        ("n[01-03,9-7]", "range '9-7' goes down"),
        ("n[]", "bad range ''"),
        ("n[a-b]", "bad range 'a-b'"),
        ("n[1-]", "bad range '1-'"),
        ("n[-3]", "bad range '-3'"),
        ("n[1-2-3]", "bad range '1-2-3'"),
        ("n[1,,2]", "bad range ''"),
        ("a,,b", "empty host name"),
        ("a,", "empty host name"),
        (",a", "empty host name"),
    ],
)
def test_expand_nodelist_errors(nodelist: str, problem: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        expand_nodelist(nodelist)
    assert str(excinfo.value) == f"invalid SLURM node list {nodelist!r}: {problem}"


@pytest.mark.parametrize("nodelist", ["", "   "])
def test_expand_nodelist_empty(nodelist: str) -> None:
    with pytest.raises(ValueError, match=re.escape("invalid SLURM node list '': it is empty")):
        expand_nodelist(nodelist)


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node[3-4],login1", "node3"), ("gpu-a[01-03,07],gpu-b12", "gpu-a01"), ("solo", "solo"), ("r[2-3]n[5-6]", "r2n5")],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_first_host_refuses_malformed() -> None:
    with pytest.raises(ValueError, match=re.escape("invalid SLURM node list 'n[2-1]': range '2-1' goes down")):
        first_host("n[2-1]")


@pytest.mark.parametrize(
    ("tasks", "counts"),
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("8(x2)", [8, 8]),
        ("1,2,3", [1, 2, 3]),
        (" 2(x2) , 1 ", [2, 2, 1]),
        ("3(x1)", [3]),
        ("2(x3),1(x2),4", [2, 2, 2, 1, 1, 4]),
    ],
)
def test_expand_tasks_per_node(tasks: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(tasks) == counts


@pytest.mark.parametrize(
    ("tasks", "item"),
    [
        ("", ""),
        ("2x3", "2x3"),
        ("2(3)", "2(3)"),
        ("2(x3", "2(x3"),
        ("a", "a"),
        ("2(x3),", ""),
        ("-1", "-1"),
        ("2 (x3)", "2 (x3)"),
    ],
)
def test_expand_tasks_per_node_errors(tasks: str, item: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        expand_tasks_per_node(tasks)
    assert str(excinfo.value) == f"invalid SLURM_TASKS_PER_NODE {tasks!r}: bad item {item!r}; expected e.g. '2(x3),1'"


@pytest.mark.parametrize(
    ("job_id", "port"),
    [(0, 20000), (1, 20001), (123456, 23456), (19999, 39999), (20000, 20000), (40001, 20001)],
)
def test_port_for_job(job_id: int, port: int) -> None:
    assert port_for_job(job_id) == port


def test_port_for_job_custom_range() -> None:
    assert port_for_job(7, low=30000, span=5) == 30002
    assert port_for_job(123456, low=1024, span=1000) == 1480


def test_port_for_job_stays_in_range() -> None:
    ports = {port_for_job(job_id) for job_id in range(0, 100_000, 7)}
    assert min(ports) >= 20000
    assert max(ports) <= 39999


def test_port_for_job_negative() -> None:
    with pytest.raises(ValueError) as excinfo:
        port_for_job(-1)
    assert str(excinfo.value) == "invalid SLURM job id -1: must be >= 0"
