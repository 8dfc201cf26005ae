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
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from x_common import env
from x_launch.config_schema import IGNORED_KEYS, LEGACY_KEYS, SCHEMA, SECTIONS, check_value, nearest

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


@dataclass
class LoadedConfig:
    path: Path
    values: dict[str, Any]  # top-level keys, and "section.key" for keys inside sections
    ignored: list[str] = field(default_factory=list)


def default_config_path() -> Path:
    base = env.XDG_CONFIG_HOME.read()
    return (Path(base) if base else Path.home() / ".config") / "x" / "launch.yaml"


def accelerate_config_path() -> Path:
    base = env.HF_HOME.read()
    return (Path(base) if base else Path.home() / ".cache" / "huggingface") / "accelerate" / "default_config.yaml"


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


def _positions(text: str) -> dict[str, tuple[int, int]]:
    """{key path: (line, column)}, 1-based, for pointing at a key in an error."""
    import yaml

    spots: dict[str, tuple[int, int]] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return spots
    if not isinstance(root, yaml.MappingNode):
        return spots
    for key_node, value_node in root.value:
        key = str(key_node.value)
        spots[key] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        if isinstance(value_node, yaml.MappingNode):
            for sub_key, _ in value_node.value:
                spots[f"{key}.{sub_key.value}"] = (sub_key.start_mark.line + 1, sub_key.start_mark.column + 1)
    return spots


def load_config(path: Path) -> LoadedConfig:
    """Read and check a config file.

    Raises:
        ConfigError: unreadable, malformed (with line and column), an unknown key (with the
            nearest valid one) or an invalid value.
    """
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; create one with: x-launch config default") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"cannot parse config file {path}: {where}{problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold key: value pairs, not a {type(data).__name__}")
    spots = _positions(text)

    def at(key: str) -> str:
        line = spots.get(key)
        return f"{path}, line {line[0]}" if line else str(path)

    values: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in data.items():
        key = str(key)
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
                raise ConfigError(f"{at(key)}: {key} must be a mapping of keys, not {value!r}")
            for sub, sub_value in value.items():
                sub = str(sub)
                fields = SECTIONS[key]
                if sub not in fields:
                    hint = nearest(sub, fields)
                    suggestion = f"; did you mean {hint!r}?" if hint else f"; valid keys: {', '.join(fields)}"
                    raise ConfigError(f"{at(f'{key}.{sub}')}: unknown key {sub!r} in {key}{suggestion}")
                values[f"{key}.{sub}"] = _checked(at(f"{key}.{sub}"), f"{key}.{sub}", fields[sub], sub_value)
        elif key in SCHEMA:
            values[key] = _checked(at(key), key, SCHEMA[key], value)
        else:
            hint = nearest(key, {*SCHEMA, *SECTIONS, *IGNORED_KEYS, *LEGACY_KEYS})
            suggestion = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(f"{at(key)}: unknown key {key!r}{suggestion}")
    return LoadedConfig(path, values, ignored)


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


def _unique_key_loader() -> type:
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice (PyYAML keeps the last one silently)."""

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} is given twice (first on line {seen[key]}); keep one",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader
