"""Joining a group that can never form, because a peer already returned: fail at once, not hang.

Under ``notebook_launcher`` a worker's function can return on one rank without building an
``Accelerator`` while another rank builds one. torch's rendezvous then waits for the rank that
is gone (the agent sees one success and one live worker, so it stops nothing) until the group
timeout, 30 minutes by default. Workers the launcher forks therefore share two counters in the
agent's store, per restart of the group: how many ranks are joining, and how many returned.
A rank that is joining waits for all to arrive, and stops with one line naming the rank that
returned instead. Ranks that all join pass this in one round trip of polling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta

from x_runtime.process.topology.agent_store import agent_store

__all__ = ["await_peers", "mark_returned"]

_POLL_S = 0.02


def _prefix(environ: Mapping[str, str]) -> str:
    run = environ.get("TORCHELASTIC_RUN_ID", "none")
    return f"x_notebook/{run}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def mark_returned(environ: Mapping[str, str], rank: int) -> None:
    """Record that ``rank``'s function returned; best effort (a gone store has no one waiting)."""
    try:
        store = agent_store(environ, timedelta(seconds=5))
        prefix = _prefix(environ)
        store.set(f"{prefix}/returned_rank", str(rank))
        store.add(f"{prefix}/returned", 1)
    except (RuntimeError, ValueError, KeyError):
        pass


def await_peers(environ: Mapping[str, str], rank: int, world_size: int, timeout: timedelta) -> None:
    """Wait until all ``world_size`` ranks are joining; RuntimeError when one returned instead.

    Each join is a generation: the ``world_size`` ranks that arrive together form it, so a group
    destroyed and joined again waits for the next full set.
    """
    store = agent_store(environ, timeout)
    prefix = _prefix(environ)
    ticket = store.add(f"{prefix}/joining", 1)
    complete = -(-ticket // world_size) * world_size
    deadline = time.monotonic() + timeout.total_seconds()
    while store.add(f"{prefix}/joining", 0) < complete:
        if store.add(f"{prefix}/returned", 0) > 0:
            gone = store.get(f"{prefix}/returned_rank").decode()
            raise RuntimeError(
                f"rank {gone} returned from the launched function without joining the process group that "
                f"rank {rank} is joining: build the Accelerator (or PartialState) in every process, or in none"
            )
        if time.monotonic() > deadline:
            return  # torch's own rendezvous reports what is missing
        time.sleep(_POLL_S)
