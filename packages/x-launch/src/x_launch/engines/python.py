"""The interpreter runs the script directly: one process, or one rank per srun task."""

from __future__ import annotations

from x_launch.config.file import ConfigError
from x_launch.engines import slurm
from x_launch.engines.base import Engine, LaunchPlan, LaunchRequest

__all__ = ["PythonEngine"]


class PythonEngine(Engine):
    """The script as the only process, or as one rank of a job whose every srun task is a rank."""

    name = "python"

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        settings, env_vars = request.settings, dict(request.env_vars)
        if request.job is not None and request.job.mode == slurm.TASK:  # SLURM started every rank
            for asked, what in ((request.log_dir, "--log_dir"), (settings.max_restarts, "--max_restarts")):
                if asked:
                    raise ConfigError(
                        f"{what} needs torchrun, which x-launch does not start when every srun task is one process: "
                        "use srun --ntasks-per-node=1 (x-launch then starts the processes on each node)"
                    )
            if not settings.main_process_port:
                raise ConfigError("--main_process_port 0 cannot work when every srun task is one rank: give a port")
            env_vars.update(slurm.rank_environment(request.job, settings))
        argv = [*request.runner(), *request.target]
        return LaunchPlan(argv, env_vars, self, settings, request.notes)
