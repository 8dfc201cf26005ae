"""torch_xla's launcher on a TPU host: one process per TPU device, each calling the script's function."""

from __future__ import annotations

import socket

from x_common import env
from x_launch.config.file import ConfigError
from x_launch.config.launch_config import LaunchConfig
from x_launch.engines.base import Engine, LaunchPlan, LaunchRequest

__all__ = ["XlaEngine"]


class XlaEngine(Engine):
    """``python -m x_launch.run.xla_spawn``: torch_xla spawns the processes and each calls a function."""

    name = "torch_xla"
    watches_stalls = False  # torch_xla's processes keep no progress records for the watchdog

    @staticmethod
    def wanted(settings: LaunchConfig) -> bool:
        """Whether ``settings`` ask for a TPU: ``--tpu``, or Accelerate's ``distributed_type: XLA``."""
        return bool(settings.tpu) or settings.distributed_type == "XLA"

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        settings, notes = request.settings, request.notes
        if settings.num_machines > 1:
            raise ConfigError(
                f"--tpu with --num_machines {settings.num_machines}: on a TPU pod, run x-launch --tpu on every host "
                "(e.g. gcloud compute tpus tpu-vm ssh NAME --worker=all --command 'x-launch --tpu train.py'), "
                "each with --num_machines 1"
            )
        if settings.use_cpu:
            raise ConfigError("--tpu and --cpu contradict each other: pick one")
        if request.module:
            raise ConfigError("--tpu calls a function of a script file: give the script's path, not -m MODULE")
        if request.log_dir:
            raise ConfigError(
                "--log_dir needs torchrun's per-rank logs; torch_xla's launcher has none: drop it with --tpu"
            )
        argv = [request.python, "-m", "x_launch.run.xla_spawn", "--main_training_function"]
        argv += [settings.main_training_function]
        if settings.num_processes == 1 and not settings.is_default("num_processes"):
            argv += ["--nprocs", "1"]
        else:
            notes.append("tpu: torch_xla starts one process per TPU device of this host")
        env_vars = {**request.env_vars, env.DISTRIBUTED_TYPE.name: "XLA"}
        if settings.downcast_bf16 and settings.mixed_precision == "bf16":
            env_vars[env.XLA_DOWNCAST_BF16.name] = "1"  # as accelerate launch --tpu --downcast_bf16
        if not env.PJRT_DEVICE.is_set():
            env_vars[env.PJRT_DEVICE.name] = "TPU"
        if not env.MASTER_PORT.is_set():
            # torch_xla's rendezvous binds MASTER_PORT, 12355 unless told: a second job on the host would clash.
            env_vars[env.MASTER_PORT.name] = str(settings.main_process_port or _free_port())
        return LaunchPlan([*argv, *request.target], env_vars, self, settings, notes)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
