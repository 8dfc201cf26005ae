"""Running a plan: the engine as a child process, the signals passed on to it, preemption and requeue,
each rank's output followed to the terminal, and the summary of a failure. Also the modules that run
in the child (``python -m x_launch.run.torchrun_agent``, ``python -m x_launch.run.xla_spawn``).
"""
