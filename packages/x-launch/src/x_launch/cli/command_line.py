"""The ``x-launch`` command line.

Nothing heavy is imported at start: ``x-launch --help`` and ``x-launch config show`` never
import torch; ``config default`` and ``env`` do, to look at the hardware.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from x_common.env import MIXED_PRECISIONS
from x_launch.cli.options import setting_options

_CONFIG_FILE = click.option(
    "--config_file",
    "--config-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Config file to use instead of the default location (also: X_CONFIG_FILE).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
# The installed distribution's version (x_launch._version is the package's own, private to its top level).
@click.version_option(package_name="x-launch", prog_name="x-launch")
def _cli() -> None:
    """Configure, check and launch PyTorch scripts.

    \b
    Examples:
      x-launch --version
      x-launch config                  # questions, with defaults detected on this machine
      x-launch config default          # write a config for this machine
      x-launch config show             # the effective config, and where each value comes from
      x-launch env                     # versions, devices and config, for a bug report
      x-launch test                    # distributed self-check under the configured launch
      x-launch --num_processes 2 --cpu train.py   # launch (see x-launch launch --help)
    """


@_cli.group(invoke_without_command=True)
@_CONFIG_FILE
@click.option("--force", is_flag=True, help="Replace an existing file without asking.")
@click.pass_context
def config(ctx: click.Context, config_file: Path | None, force: bool) -> None:
    """Create and inspect the launch config (YAML, Accelerate's key names).

    Without a subcommand, asks questions (Enter accepts the default shown) and saves the answers.

    \b
    Examples:
      x-launch config
      x-launch config --config_file ./launch.yaml
    """
    if ctx.invoked_subcommand is not None:
        return
    from x_common.devices import device_count
    from x_launch.commands.questionnaire import ask_config
    from x_launch.config.file import save_config

    path = _target_path(config_file)
    if path.exists() and not force:
        # Ask before the questions, not after: nobody should answer twenty questions for nothing.
        try:
            replace = click.confirm(f"{path} exists. Replace it?")
        except click.Abort:
            # stdin ended (a script, CI): "Aborted." alone would not say why, nor what to do.
            click.echo(f"x-launch: {path} exists and no answer came on stdin; pass --force to replace it", err=True)
            ctx.exit(1)
        if not replace:
            raise click.Abort
    values = ask_config(gpus=device_count("cuda"))
    save_config(path, values, force=True)
    click.echo(f"wrote {path}")


def _target_path(config_file: Path | None) -> Path:
    from x_common import env
    from x_launch.config.file import default_config_path

    named = env.CONFIG_FILE.read()
    return config_file or (Path(named).expanduser() if named else default_config_path())


@config.command("default")
@_CONFIG_FILE
@click.option(
    "--mixed_precision",
    "--mixed-precision",
    type=click.Choice(MIXED_PRECISIONS),
    default=None,
    help="The precision to train in (as `accelerate config default --mixed_precision`); default: no.",
)
@click.option("--force", is_flag=True, help="Replace an existing file.")
def config_default(config_file: Path | None, mixed_precision: str | None, force: bool) -> None:
    """Write a config for this machine without asking questions.

    \b
    Examples:
      x-launch config default
      x-launch config default --mixed_precision bf16
      x-launch config default --config_file ./launch.yaml --force
    """
    from x_common.devices import device_count
    from x_launch.config.file import save_config
    from x_launch.config.schema import machine_defaults

    path = _target_path(config_file)
    values = machine_defaults(device_count("cuda"))
    if mixed_precision is not None:
        values["mixed_precision"] = mixed_precision
    save_config(path, values, force=force)
    click.echo(f"wrote {path}")


@config.command("show")
@_CONFIG_FILE
def config_show(config_file: Path | None) -> None:
    """Print the effective config and where each value came from.

    \b
    Precedence: flag > X_LAUNCH_<KEY> variable > config file > default.
    """
    from x_launch.config.file import find_config, load_config
    from x_launch.config.resolve import resolve

    path, why = find_config(config_file)
    loaded = load_config(path) if path is not None else None
    settings = resolve(loaded)  # before printing anything: a bad value is one line, nothing else
    click.echo(f"config file: {path} ({why})" if path is not None else "config file: none (defaults only)")
    for line in settings.shown():
        click.echo(line)
    if loaded is not None and loaded.ignored:
        click.echo(f"ignored (Accelerate features x does not offer): {', '.join(loaded.ignored)}")


@_cli.command("env")
@_CONFIG_FILE
def env_command(config_file: Path | None) -> None:
    """Print versions, platform, devices, memory and the config file, ready for a bug report."""
    from x_launch.commands.env_report import env_report
    from x_launch.config.file import find_config

    path, why = find_config(config_file)
    click.echo(env_report(path, why))


@_cli.command("test")
@_CONFIG_FILE
@setting_options(["num_processes", "use_cpu", "mixed_precision"])
def test_command(
    config_file: Path | None, num_processes: str | None, use_cpu: bool | None, mixed_precision: str | None
) -> None:
    """Run a short distributed self-check under the configured launch.

    \b
    Checks, one line each: rendezvous, rank layout, device per rank, all_reduce, broadcast,
    all_gather and, when x-runtime is installed, the Accelerator (data sharding,
    gather_for_metrics, training parity). Exits non-zero naming the check that failed.

    \b
    Examples:
      x-launch test
      x-launch test --config_file "./my configs/launch.yaml"
      x-launch test --num_processes 2 --cpu
      x-launch test --mixed_precision bf16   # training parity to bf16's tolerance
    """
    from x_launch.commands.self_test import run_self_check
    from x_launch.config.file import find_config, load_config
    from x_launch.config.resolve import resolve
    from x_launch.engines.plan import build_plan

    path, _ = find_config(config_file)
    flags = {"num_processes": num_processes, "use_cpu": use_cpu, "mixed_precision": mixed_precision}
    settings = resolve(load_config(path) if path is not None else None, flags)
    # Built once before starting anything: a bad config is one line; SLURM may change the world size.
    probe = build_plan(settings, ["x_launch.commands.selfcheck"], module=True)
    world = probe.settings.num_processes
    sys.exit(run_self_check(lambda target: build_plan(settings, target, module=True), world, click.echo))


@_cli.command("migrate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--write", is_flag=True, help="Rewrite the files in place (atomically) instead of only printing the diff."
)
def migrate(files: tuple[Path, ...], write: bool) -> None:
    """Rewrite scripts' imports from Accelerate to x and print the unified diff.

    \b
    Each name imported from accelerate or accelerate.<module> comes from the x package that
    exports it: x_bigmodel (init_empty_weights, load_checkpoint_and_dispatch, ..., the hooks),
    x_runtime (the rest), x_launch (accelerate.commands.*). A name x does not have keeps its
    import from accelerate, and a line on stderr says so. `import accelerate` becomes
    `import x_runtime as accelerate`. The imports of one x module in a run of import lines
    are merged into one. Only imports change, and a PEP 723 `# /// script` block's accelerate
    requirement (it becomes the x packages the script imports); each use of
    `DistributedType.TPU` gets a line on stderr with its fix.

    \b
    Examples:
      x-launch migrate train.py
      x-launch migrate --write train.py utils.py
    """
    from x_launch.config.file import ConfigError
    from x_launch.migrate.rewrite import MigrateError, migrate_file

    try:
        diffs = [(path, *migrate_file(path)) for path in files]  # every file checked before any is written
        for path, diff, notes in diffs:
            if diff and write:
                migrate_file(path, write=True)
            click.echo(diff, nl=False)
            for note in notes:
                click.echo(f"x-launch migrate: {note}", err=True)
    except MigrateError as exc:
        raise ConfigError(str(exc)) from None


@_cli.command("merge-weights")
@click.argument("checkpoint_directory")
@click.argument("output_path")
@click.option("--unsafe_serialization", "--unsafe-serialization", is_flag=True, help="Save .bin, not .safetensors.")
@click.option("--remove_checkpoint_dir", "--remove-checkpoint-dir", is_flag=True, help="Remove the shards after.")
def merge_weights(
    checkpoint_directory: str, output_path: str, unsafe_serialization: bool, remove_checkpoint_dir: bool
) -> None:
    """Merge an FSDP SHARDED_STATE_DICT checkpoint into one weights file (as accelerate merge-weights).

    \b
    Examples:
      x-launch merge-weights ckpt/pytorch_model_fsdp_0 merged/
      x-launch merge-weights ckpt/pytorch_model_fsdp_0 merged/ --unsafe_serialization
    """
    import argparse

    from x_launch.commands.merge_weights import MergeUnavailable, merge_command
    from x_launch.config.file import ConfigError

    args = argparse.Namespace(
        checkpoint_directory=checkpoint_directory,
        output_path=output_path,
        unsafe_serialization=unsafe_serialization,
        remove_checkpoint_dir=remove_checkpoint_dir,
    )
    try:
        merge_command(args)
    except (MergeUnavailable, ValueError, OSError) as exc:
        raise ConfigError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    click.echo(f"merged {checkpoint_directory} into {output_path}")


def _flag(name: str, *short: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    from x_common.env import launch_flag_var

    dashed = name.replace("_", "-")
    names = [*short, f"--{name}", f"--{dashed}"] if dashed != name else [*short, f"--{name}"]
    return click.option(*names, name, envvar=launch_flag_var(name), show_envvar=True, **kwargs)


@click.command(
    "launch",
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
)
@_CONFIG_FILE
@setting_options()
@click.option("-m", "--module", is_flag=True, help="TARGET is a module to run as python -m does.")
@_flag("no_python", is_flag=True, help="TARGET is an executable: run it without the interpreter.")
@_flag("dry_run", is_flag=True, help="Print the resolved config, the command and its environment; start nothing.")
@_flag("log_dir", default=None, help="Write each rank's output to files in this folder.")
@_flag(
    "tee",
    "-t",
    default=None,
    metavar="[STREAMS]",
    help="With --log_dir, also print each rank's output: alone both streams; as Accelerate, 0-3 or 0:1,1:2.",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="Accepted for accelerate launch: x-launch reports the failing rank only."
)
@_flag("same_network", is_flag=True, help="Accepted for accelerate launch: machines meet at --main_process_ip.")
@click.argument("target", nargs=-1, type=click.UNPROCESSED, required=True)
def launch(
    config_file: Path | None,
    module: bool,
    no_python: bool,
    dry_run: bool,
    log_dir: str | None,
    tee: str | None,
    quiet: bool,
    same_network: bool,
    target: tuple[str, ...],
    **flags: Any,
) -> None:
    """Run TARGET (a script and its arguments, or -m MODULE ...) as configured.

    Every option can also come from X_LAUNCH_<OPTION>; options beat the config file.

    \b
    Examples:
      x-launch train.py --epochs 3
      x-launch --num_processes 2 --cpu train.py
      x-launch --num_processes 2 --dry-run -m mypkg.train
    """
    from x_launch.cli.accelerate_flags import TEE_STREAMS
    from x_launch.config.file import ConfigError, find_config, load_config
    from x_launch.config.resolve import resolve
    from x_launch.engines.plan import build_plan

    if tee is not None and not TEE_STREAMS.fullmatch(tee):
        raise ConfigError(f"--tee {tee}: expected 0, 1, 2, 3 (none, stdout, stderr, both) or per rank, e.g. 0:3,1:2")
    if no_python:
        pass  # an executable on PATH or a path: torchrun and the OS find it
    elif not module and Path(target[0]).is_dir():
        inside = Path(target[0]) / "train.py"
        raise ConfigError(f"{target[0]} is a folder, not a script: give the script inside it, e.g. {inside}")
    elif not module and not Path(target[0]).is_file():
        raise ConfigError(f"script {target[0]} does not exist (to run a module, use -m {target[0]})")
    path, _ = find_config(config_file)
    settings = resolve(load_config(path) if path is not None else None, flags)
    plan = build_plan(settings, list(target), module=module, log_dir=log_dir, tee=tee or False, no_python=no_python)
    if dry_run:
        click.echo(plan.describe())
        return
    from x_launch.run.process import run_plan

    sys.exit(run_plan(plan, click.get_current_context().obj))  # main's EarlySignals, or None


# Listed in `x-launch --help` among the commands; main() runs it itself, the word being optional.
_cli.add_command(launch)


def _value_options(command: click.Command) -> set[str]:
    """The spellings of ``command``'s options that take a value."""
    return {
        name
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag
        for name in (*param.opts, *param.secondary_opts)
    }


def _is_launch(args: list[str]) -> bool:
    """Whether argv asks to launch something rather than to run a subcommand."""
    if not args or args[0] in ("-h", "--help", "--version") or args[0] in _cli.commands:
        return False
    return args[0].startswith("-") or args[0].endswith(".py") or Path(args[0]).exists()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: bad input is one line on stderr and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["launch"]:
        # `accelerate launch ...` habits: the word is optional here (`x-launch launch --help` too).
        args, command = args[1:] or ["--help"], launch
    else:
        command = launch if _is_launch(args) else _cli
    early = None
    if command is launch and argv is None:  # a process of its own: the signal handlers are ours
        from x_launch.run.early_signals import EarlySignals

        early = EarlySignals.catch()
    from x_launch.cli.accelerate_flags import prepare_launch_args
    from x_launch.config.file import ConfigError

    try:
        if command is launch:
            args = prepare_launch_args(args, _value_options(launch))
    except ValueError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    try:
        code: Any = command.main(args=args, prog_name="x-launch", standalone_mode=False, obj=early)
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "Usage: x-launch [OPTIONS] COMMAND", err=True)
        sys.exit(2)
    except click.UsageError as exc:
        click.echo(f"Error: {exc.format_message()} (see x-launch --help)", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
