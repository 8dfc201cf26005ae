"""SLURM's compressed host and task lists, parsed in pure Python (no ``scontrol`` call).

``SLURM_JOB_NODELIST`` looks like ``gpu-a[01-03,07],gpu-b12``; ``SLURM_TASKS_PER_NODE``
like ``2(x3),1``.
"""

from __future__ import annotations

import re

__all__ = ["expand_nodelist", "expand_tasks_per_node", "first_host", "port_for_job"]

_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"invalid SLURM node list {text!r}: unbalanced ']'")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"invalid SLURM node list {text!r}: unbalanced '['")
    parts.append(text[start:])
    return parts


def _expand_range(nodelist: str, spec: str) -> list[str]:
    values = []
    for item in spec.split(","):
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"invalid SLURM node list {nodelist!r}: bad range {item!r}")
        if not sep:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"invalid SLURM node list {nodelist!r}: range {item!r} goes down")
        width = len(low)  # zero padding of the lower bound carries over: 08-10 -> 08,09,10
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def _expand_host(nodelist: str, pattern: str) -> list[str]:
    start = pattern.find("[")
    if start == -1:
        return [pattern]
    end = pattern.find("]", start)
    head, spec, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    return [head + value + rest for value in _expand_range(nodelist, spec) for rest in _expand_host(nodelist, tail)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Every host named by a SLURM node list, in order.

    Examples:
        >>> expand_nodelist("gpu-a[01-03,07],gpu-b12")
        ['gpu-a01', 'gpu-a02', 'gpu-a03', 'gpu-a07', 'gpu-b12']

    Raises:
        ValueError: the list is malformed; the message quotes it and the bad part.
    """
    if not nodelist.strip():
        raise ValueError("invalid SLURM node list '': it is empty")
    hosts: list[str] = []
    for part in _split_top_level(nodelist.strip()):
        if not part:
            raise ValueError(f"invalid SLURM node list {nodelist!r}: empty host name")
        hosts.extend(_expand_host(nodelist, part))
    return hosts


def first_host(nodelist: str) -> str:
    """The first host of a node list: where rank 0 runs and the rendezvous listens.

    Examples:
        >>> first_host("node[3-4],login1")
        'node3'
    """
    return expand_nodelist(nodelist)[0]


def expand_tasks_per_node(tasks: str) -> list[int]:
    """Task count of every host, from ``SLURM_TASKS_PER_NODE``.

    Examples:
        >>> expand_tasks_per_node("2(x3),1")
        [2, 2, 2, 1]
    """
    counts: list[int] = []
    for item in tasks.split(","):
        match = _TASKS_RE.match(item.strip())
        if match is None:
            raise ValueError(f"invalid SLURM_TASKS_PER_NODE {tasks!r}: bad item {item!r}; expected e.g. '2(x3),1'")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


def port_for_job(job_id: int, *, low: int = 20000, span: int = 20000) -> int:
    """A rendezvous port that every task of the job computes alike, spread across jobs.

    Two jobs sharing a host collide only when their ids are ``span`` apart.

    Examples:
        >>> port_for_job(123456)
        23456
    """
    if job_id < 0:
        raise ValueError(f"invalid SLURM job id {job_id}: must be >= 0")
    return low + job_id % span
