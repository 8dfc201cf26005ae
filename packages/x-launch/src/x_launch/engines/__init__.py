"""What runs a job: one class per engine behind one small base, and the plan that picks one.

``Engine`` (``base``) is what every engine declares: its name, how it builds its command
(``plan``), and what it needs while the job runs. The engines are ``PythonEngine`` (the interpreter
runs the script), ``TorchrunEngine`` (torchrun's elastic agent), ``SrunEngine`` (one x-launch per
SLURM node) and ``XlaEngine`` (torch_xla's launcher on a TPU host). ``build_plan`` (``plan``) checks
the settings, reads the SLURM allocation (``slurm``) and the machine (``preflight``) and asks the
chosen engine for the command.
"""
