"""The processes on this machine as /proc shows them: what the fault and preemption tests watch."""

from __future__ import annotations

from pathlib import Path


def process_table() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, parent pid, session id) of every process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (fields[0], int(fields[1]), int(fields[3]))
    return table


def descendants(pid: int) -> set[int]:
    """Every live (not zombie) process below ``pid``."""
    children: dict[int, list[int]] = {}
    for child, (state, parent, _session) in process_table().items():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
