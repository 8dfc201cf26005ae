"""Where MODEL comes from: a local folder, the Hugging Face Hub (config only, cache first when
offline) or timm's registry. Nothing but a ``config.json`` is ever downloaded.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import socket
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from x_estimate.model.errors import EstimateError

__all__ = ["LIBRARIES", "TIMM_INSTALL", "ModelSource", "resolve_source", "timm_module"]

LIBRARIES = ("transformers", "timm")
TIMM_INSTALL = 'timm is not installed: pip install "x-estimate[timm]"'


@dataclass(frozen=True)
class ModelSource:
    """A model to build: ``config`` is the parsed config.json (None for timm registry names)."""

    name: str
    library: str
    origin: str  # "local folder", "Hugging Face cache", "Hugging Face Hub", "timm registry"
    config_dir: Path | None = None
    config_file: Path | None = None  # the file read: config.json, or the one the user named
    config: dict[str, Any] | None = None
    timm_name: str | None = None
    token: str | None = field(default=None, repr=False)  # for fetching remote code of gated repos


def _library_of(config: dict[str, Any]) -> str:
    # timm's Hub configs name one "architecture"; transformers' carry "model_type"/"architectures".
    return "timm" if "architecture" in config and "model_type" not in config else "transformers"


def _read_config(path: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise EstimateError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise EstimateError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); is {name} a model folder?"
        ) from None
    if not isinstance(data, dict):
        raise EstimateError(f"{path} holds a JSON {type(data).__name__}, not a model config object")
    return data


def _looks_like_path(model: str) -> bool:
    # Hub ids have exactly one slash ("org/name"); anything else with slashes is a path.
    return model.startswith((".", "/", "~")) or model.endswith(("/", os.sep)) or model.count("/") > 1


def _missing_local_folder(model: str) -> str | None:
    """For ``org/name`` the Hub did not give, whose ``org`` is a folder here: a mistyped path, said as one.

    Only after the Hub (its cache, offline) was asked: a folder named as a Hub organisation never
    hides a cached Hub id.
    """
    parent, _, name = model.partition("/")
    if not name or not Path(parent).is_dir():
        return None
    try:
        present = sorted(p.name for p in Path(parent).iterdir() if p.is_dir())
    except OSError:
        present = []
    near = difflib.get_close_matches(name, present, n=3)
    hint = f"; did you mean {' or '.join(f'{parent}/{n}' for n in near)}?" if near else ""
    return f"{model}: no such folder ({parent}/ is a folder here; nor can a Hub id of that name be read){hint}"


def resolve_source(model: str, library: str | None = None, *, token: str | None = None) -> ModelSource:
    """Find ``model`` without downloading weights.

    Examples:
        >>> resolve_source("resnet50", "timm").origin
        'timm registry'

    Raises:
        EstimateError: the model cannot be found; the message says where it looked and what to do.
    """
    return replace(_resolve(model, library, token), token=token)


def _resolve(model: str, library: str | None, token: str | None) -> ModelSource:
    if library is not None and library not in LIBRARIES:
        raise EstimateError(f"unknown library {library!r}; expected one of {', '.join(LIBRARIES)}")
    path = Path(model).expanduser()
    if path.exists():
        return _local(model, path, library)
    if _looks_like_path(model):
        raise EstimateError(
            f"{model}: no such file or folder; pass a folder holding config.json, a Hub id or a timm name"
        )
    if library == "timm" or (library is None and (model.startswith("hf-hub:") or _is_timm_name(model))):
        return _timm(model)
    try:
        return _hub(model, library, token)
    except EstimateError as exc:
        missing = _missing_local_folder(model)
        if missing is not None:
            raise EstimateError(missing) from None
        if "/" in model or library is not None or timm_module() is not None:
            raise
        # A bare name may be a timm model that we could not recognise without timm.
        raise EstimateError(f'{exc} (if {model} is a timm model: pip install "x-estimate[timm]")') from None


def _local(model: str, path: Path, library: str | None) -> ModelSource:
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise EstimateError(f"{model} has no config.json; pass the folder a model was saved to (save_pretrained)")
    return _from_config_file(model, library, config_path, "local folder")


def timm_module() -> Any:
    """timm, or None when it is not installed (checked without importing it first)."""
    try:
        if importlib.util.find_spec("timm") is None:
            return None
        import timm
    except (ImportError, ValueError):
        return None
    return timm


def _is_timm_name(model: str) -> bool:
    if "/" in model and not model.startswith("timm/"):
        return False
    try:
        installed = importlib.util.find_spec("timm") is not None
    except ValueError:
        installed = False
    if not installed:
        return model.startswith("timm/")
    timm = timm_module()
    return timm is not None and timm.is_model(model.removeprefix("timm/"))


def _timm(model: str) -> ModelSource:
    timm = timm_module()
    if timm is None:
        raise EstimateError(TIMM_INSTALL)

    name = model.removeprefix("hf-hub:")
    bare = name.removeprefix("timm/")
    if timm.is_model(bare):
        # The registry knows the architecture and each pretrained tag's head size: no network.
        return ModelSource(model, "timm", "timm registry", timm_name=bare)
    if "/" not in name:
        raise EstimateError(
            f'{model!r} is not a timm model name; list them with: python -c "import timm; print(timm.list_models())"'
        )
    source = _hub(name, "timm", None)
    return replace(source, name=model)


def _hub(repo_id: str, library: str | None, token: str | None) -> ModelSource:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        # local_files_only first: a cached config answers without network, offline or not.
        path = Path(hf_hub_download(repo_id, "config.json", token=token, local_files_only=True))
        return _from_config_file(repo_id, library, path, "Hugging Face cache")
    except (EntryNotFoundError, OSError, ValueError):
        pass
    how = f"download its config once (hf download {repo_id} config.json) or pass a local folder"
    if offline:
        raise EstimateError(f"{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: {how}")
    if not _reachable(constants.ENDPOINT):
        # Without this check huggingface_hub retries for ~20 s before giving up.
        raise EstimateError(
            f"{repo_id} is not in the Hugging Face cache and {constants.ENDPOINT} cannot be reached: {how}"
        )
    try:
        path = Path(hf_hub_download(repo_id, "config.json", token=token))
    except GatedRepoError:
        raise EstimateError(
            f"{repo_id} is gated: accept its terms on the Hub, then log in (hf auth login) or set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise EstimateError(
            f"{repo_id}: no such repository on the Hub, or it is private (log in or set HF_TOKEN to reach it)"
        ) from None
    except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: the network failed midway
        raise EstimateError(f"{repo_id}: the Hub stopped answering and the config is not cached: {how}") from None
    except EntryNotFoundError:
        raise EstimateError(f"{repo_id} has no config.json; x-estimate needs a transformers or timm config") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise EstimateError(f"{repo_id}: {str(exc).splitlines()[0]}") from None
    return _from_config_file(repo_id, library, path, "Hugging Face Hub")


def hub_reachable() -> bool:
    """Whether the Hub answers a TCP connection within a few seconds."""
    from huggingface_hub import constants

    return _reachable(constants.ENDPOINT)


def _reachable(endpoint: str, timeout: float = 3.0) -> bool:
    parsed = urllib.parse.urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _from_config_file(model: str, library: str | None, path: Path, origin: str) -> ModelSource:
    config = _read_config(path, model)
    found = library or _library_of(config)
    if found == "timm":
        arch = config.get("architecture")
        if not isinstance(arch, str):
            raise EstimateError(f"{path} names no timm 'architecture'; is {model} a timm model?")
        return ModelSource(model, "timm", origin, path.parent, path, config, arch)
    return ModelSource(model, found, origin, path.parent, path, config)
