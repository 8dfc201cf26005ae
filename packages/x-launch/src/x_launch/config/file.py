"""Where the launch config lives, reading it with errors that point at the line, and writing
it without ever clobbering a user's file.

Lookup order: ``--config_file``, then ``X_CONFIG_FILE``, then ``$XDG_CONFIG_HOME/x/launch.yaml``
(``~/.config/x/launch.yaml``), then Accelerate's ``$HF_HOME/accelerate/default_config.yaml``
(``~/.cache/huggingface/...``) so that a machine configured for Accelerate needs nothing new.
Files are YAML; JSON is YAML too, so Accelerate's JSON-in-``.yaml`` files read as well.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from x_common import env
from x_launch.config.bounded_yaml import MAX_BYTES, YamlProblem, decode, parse
from x_launch.config.schema import IGNORED_KEYS, LEGACY_KEYS, SCHEMA, SECTIONS, check_value, nearest
from x_launch.config.value_preview import preview

__all__ = [
    "ConfigError",
    "LoadedConfig",
    "accelerate_config_path",
    "as_yaml_document",
    "default_config_path",
    "find_config",
    "load_config",
    "save_config",
]


class ConfigError(ValueError):
    """A config file problem; the message names the file, the line and the fix."""

    exit_code = 2  # bad input


class LaunchRefused(ConfigError):
    """The input is fine but this machine's state forbids the launch now (a port in use)."""

    exit_code = 1


@dataclass
class LoadedConfig:
    path: Path
    values: dict[str, Any]  # top-level keys, and "section.key" for keys inside sections
    ignored: list[str] = field(default_factory=list)


def default_config_path() -> Path:
    base = env.XDG_CONFIG_HOME.read()
    return (Path(base) if base else Path.home() / ".config") / "x" / "launch.yaml"


def accelerate_config_path() -> Path:
    """Accelerate's default config file: under ``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else
    ``~/.cache/huggingface``, as Accelerate finds it."""
    home = env.HF_HOME.read()
    if not home:
        cache = env.XDG_CACHE_HOME.read()
        home = str(Path(cache) / "huggingface") if cache else str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "accelerate" / "default_config.yaml"


def find_config(explicit: str | os.PathLike[str] | None = None) -> tuple[Path | None, str]:
    """(path, why) of the config to use; path is None when there is none.

    An explicit path (flag or ``X_CONFIG_FILE``) must exist; the default locations may not.
    """
    if explicit is not None:
        return Path(explicit).expanduser(), "--config_file"
    named = env.CONFIG_FILE.read()
    if named:
        return Path(named).expanduser(), env.CONFIG_FILE.name
    own = default_config_path()
    if own.is_file():
        return own, "default location"
    theirs = accelerate_config_path()
    if theirs.is_file():
        return theirs, "Accelerate's default location"
    return None, "no config file"


def load_config(path: Path) -> LoadedConfig:
    """Read and check a config file, in a small fraction of a second whatever it holds.

    An empty file (or one of comments only) means every setting takes its default, as no file
    does; a warning line on stderr says so, in case the file was meant to hold settings.

    Raises:
        ConfigError: one line naming the file: unreadable, too big, not UTF-8 text, malformed
            (with line and column), an alias bomb, a key given twice, an unknown key (with the
            nearest valid one) or an invalid value.
    """
    try:
        document = parse(decode(_read_bytes(path)))
    except YamlProblem as exc:
        verb = "read" if exc.reading else "parse"
        raise ConfigError(f"cannot {verb} config file {path}: {exc.where()}{exc.what}") from None
    data = document.data
    if data is None:
        print(f"Warning: config file {path} is empty: every setting takes its default", file=sys.stderr)
        return LoadedConfig(path, {}, [])
    if not isinstance(data, dict):
        shown = "" if isinstance(data, list) else f" ({preview(data, 40)})"
        raise ConfigError(
            f"config file {path} must hold key: value pairs, not {_KINDS.get(type(data), 'a value')}{shown}; "
            "write one key: value per line, e.g. num_processes: 2"
        )
    spots = document.spots

    def at(key: str) -> str:
        line = spots.get(key)
        return f"{path}, line {line[0]}" if line else str(path)

    values: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in data.items():
        key = str(key)  # bounded: the loader refused anything big
        if key in IGNORED_KEYS:
            ignored.append(key)
        elif key in LEGACY_KEYS:
            section, _, sub = LEGACY_KEYS[key].partition(".")
            if LEGACY_KEYS[key] not in values:  # the section's own key wins
                values[LEGACY_KEYS[key]] = _checked(at(key), key, SECTIONS[section][sub], value)
        elif key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{at(key)}: {key} must be a mapping of keys, not {preview(value)}")
            for sub, sub_value in value.items():
                sub = str(sub)
                fields = SECTIONS[key]
                if sub not in fields:
                    hint = nearest(sub, fields)
                    suggestion = f"; did you mean {hint!r}?" if hint else f"; valid keys: {', '.join(fields)}"
                    raise ConfigError(f"{at(f'{key}.{sub}')}: unknown key {preview(sub)} in {key}{suggestion}")
                values[f"{key}.{sub}"] = _checked(at(f"{key}.{sub}"), f"{key}.{sub}", fields[sub], sub_value)
        elif key in SCHEMA:
            values[key] = _checked(at(key), key, SCHEMA[key], value)
        else:
            hint = nearest(key, {*SCHEMA, *SECTIONS, *IGNORED_KEYS, *LEGACY_KEYS})
            suggestion = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(f"{at(key)}: unknown key {preview(key)}{suggestion}")
    return LoadedConfig(path, values, ignored)


# What a YAML document that is not a mapping holds, in the file's own words.
_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, reading no more than one past the bound (it may be /dev/zero)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; create one with: x-launch config default") from None
    except IsADirectoryError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}; give the path of a YAML file in it") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(
            f"config file {path} is larger than {MAX_BYTES // 1024} KiB, and a launch config is a few hundred "
            "bytes; is it the right file?"
        )
    return raw


def _checked(where: str, name: str, spec: Any, value: Any) -> Any:
    try:
        return check_value(name, spec, value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def as_yaml_document(values: dict[str, Any]) -> dict[str, Any]:
    """Nest "section.key" entries back under their sections, for writing."""
    doc: dict[str, Any] = {}
    for key, value in values.items():
        section, dot, sub = key.partition(".")
        if dot:
            doc.setdefault(section, {})[sub] = value
        else:
            doc[key] = value
    return doc


def save_config(path: Path, values: dict[str, Any], *, force: bool = False) -> None:
    """Write YAML atomically (temporary file, fsync, rename).

    Raises:
        ConfigError: the file exists and ``force`` is false, or it cannot be written.
    """
    import yaml

    if path.exists() and not force:
        raise ConfigError(f"{path} already exists; pass --force to replace it")
    try:
        mode = path.stat().st_mode & 0o777  # keep a replaced file's permissions
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # what open() would have given a new file
    text = yaml.safe_dump(as_yaml_document(values), sort_keys=False)
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(f"cannot write {path}: {blocker} is a file, not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, mode)  # mkstemp makes files 0600
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
