"""A client of the store torch's elastic agent keeps for its workers (``MASTER_ADDR``/``MASTER_PORT``).

The agent's store outlives every restart of the workers, so what x keeps per attempt in it
(the rendezvous of ``elastic_rendezvous``, the join counters of ``peer_exit``) is named by the
attempt. A client never waits for other workers: only the agent's own store is the master.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as dist

__all__ = ["agent_store"]


def agent_store(environ: Mapping[str, str], timeout: timedelta) -> dist.TCPStore:
    """Connect to the agent's store; ``timeout`` bounds the connection and every later wait on a key."""
    return dist.TCPStore(
        environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), is_master=False, timeout=timeout, wait_for_workers=False
    )
