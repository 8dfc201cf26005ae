"""Topology: where this process sits in the job, and how it joins the others.

``state`` (``ProcessState``: rank, world, device, backend, process group) is built from the first
of the ordered ``environments`` that detects the process (XLA, torchrun, SLURM, single), each
answering the ``environment_contract``; every environment joins through ``join_group``.
``elastic_rendezvous`` and ``peer_exit`` keep restarted or departed workers from hanging a join,
both through the elastic agent's store (``agent_store``). ``distributed_type`` names the strategies.
"""

from x_runtime.process.topology.distributed_type import SHARDED, DistributedType
from x_runtime.process.topology.environment_contract import ClusterEnvironment, GroupOptions, Placement, Request
from x_runtime.process.topology.environments import ENVIRONMENTS, locate
from x_runtime.process.topology.join_group import join_group
from x_runtime.process.topology.state import ProcessState

__all__ = [
    "ENVIRONMENTS",
    "SHARDED",
    "ClusterEnvironment",
    "DistributedType",
    "GroupOptions",
    "Placement",
    "ProcessState",
    "Request",
    "join_group",
    "locate",
]
