"""A rendezvous for workers torch's elastic agent restarted: keys of this attempt only.

Under torchrun (and ``notebook_launcher``) the workers meet in the agent's own TCPStore, which
lives as long as the agent. torch 2.13's ``env://`` handler stopped prefixing worker keys with
the restart count ("a new TCPStore for every retry", which the agent store is not), so after a
restart gloo reads the addresses the dead workers of the previous attempt published and fails
with "Connection refused" or hangs (seen here on plain torchrun scripts, static and standalone,
in most runs with ``--max-restarts``). This handler joins the same store under
``/x/attempt_<TORCHELASTIC_RESTART_COUNT>``, as torch itself did before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from x_runtime.core.settings import current_settings
from x_runtime.process.topology.agent_store import agent_store

__all__ = ["attempt_rendezvous"]

_SCHEME = "x-elastic"


def _join(url: str, timeout: timedelta = timedelta(minutes=30), **_: Any) -> Iterator[tuple[dist.Store, int, int]]:
    query = {key: values[-1] for key, values in parse_qs(urlparse(url).query).items()}
    rank, world_size = int(query["rank"]), int(query["world_size"])
    # torch calls this while the group is joined, inside the accelerator being built: its snapshot.
    environ = current_settings().environ
    store = agent_store(environ, timeout)
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    yield dist.PrefixStore(f"/x/attempt_{attempt}", store), rank, world_size
    raise RuntimeError("the x-elastic rendezvous cannot be retried: start the worker again")


def attempt_rendezvous(environ: Mapping[str, str]) -> str | None:
    """``x-elastic://`` when the workers meet in torch's agent store, else None (torch's ``env://``)."""
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_PORT" not in environ:
        return None
    with contextlib.suppress(RuntimeError):  # registered by an earlier accelerator in this process
        dist.register_rendezvous_handler(_SCHEME, _join)
    return f"{_SCHEME}://"
