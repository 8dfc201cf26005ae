"""srun starts one x-launch per node of the SLURM allocation, and each starts its own engine."""

from __future__ import annotations

from x_launch.engines import slurm
from x_launch.engines.base import Engine, LaunchPlan, LaunchRequest

__all__ = ["SrunEngine"]


class SrunEngine(Engine):
    """``srun`` over the allocation's nodes: the x-launch on each node relays signals and watches its ranks."""

    name = "srun"
    relays_preemption = False  # srun passes the signal on to the x-launch of every node
    watches_stalls = False

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        if request.job is None:
            raise ValueError("srun runs inside a SLURM allocation: the request has no job")
        argv = slurm.srun_argv(
            request.job,
            request.settings,
            request.target,
            module=request.module,
            log_dir=request.log_dir,
            tee=request.tee,
            python=request.python,
        )
        # The x-launch on each node sets the environment.
        return LaunchPlan(argv, {}, self, request.settings, request.notes)
