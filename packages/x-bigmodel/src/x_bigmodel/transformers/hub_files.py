"""Which files a transformers model is: a local folder, or a Hub id resolved through huggingface_hub's cache.

Only what loading needs is fetched from the Hub: ``config.json`` (by ``AutoConfig``), then the
sharded index and the shards it names, or the single weights file. With ``HF_HUB_OFFLINE=1`` (or
``local_files_only=True``) everything comes from the cache. Pickled ``.bin`` weights are refused
unless ``use_safetensors=False``: reading them runs ``torch.load``, safe only with
``weights_only=True`` (which the loader uses) and still slower and copy-bound.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from x_bigmodel.files.checkpoint_files import resolve_checkpoint_files

__all__ = ["SAFE_NAMES", "TORCH_NAMES", "resolve_model_files"]

# The names save_pretrained writes, index first: a sharded save also leaves no single file.
SAFE_NAMES = ("model.safetensors.index.json", "model.safetensors")
TORCH_NAMES = ("pytorch_model.bin.index.json", "pytorch_model.bin")


def resolve_model_files(
    model: str | os.PathLike[str],
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    local_files_only: bool = False,
    use_safetensors: bool = True,
) -> dict[Path, list[str] | None]:
    """The checkpoint files of ``model`` (a folder, or a Hub id), each with the keys to read from it.

    Raises:
        ValueError: no safetensors weights are found (naming the folder or id; ``.bin`` ones found
            are named, with ``use_safetensors=False`` as the way to read them), or the files are
            inconsistent (see ``resolve_checkpoint_files``).
    """
    names = SAFE_NAMES + (() if use_safetensors else TORCH_NAMES)
    folder = Path(model)
    if folder.is_dir():
        for name in names:
            if (folder / name).is_file():
                return resolve_checkpoint_files(folder / name)
        found = [name for name in TORCH_NAMES if (folder / name).is_file()]
        raise ValueError(_no_weights(str(folder), found))
    cache = None if cache_dir is None else os.fspath(cache_dir)  # huggingface_hub takes a str or a Path
    return _from_hub(str(model), names, revision, token, cache, local_files_only)


def _from_hub(
    repo_id: str,
    names: tuple[str, ...],
    revision: str | None,
    token: str | bool | None,
    cache_dir: str | None,
    local_files_only: bool,
) -> dict[Path, list[str] | None]:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    def download(filename: str) -> Path:
        return Path(
            hf_hub_download(
                repo_id,
                filename,
                revision=revision,
                token=token,
                cache_dir=cache_dir,
                local_files_only=local_files_only,
            )
        )

    misses = []
    for name in names:
        try:
            path = download(name)
        except (EntryNotFoundError, LocalEntryNotFoundError) as exc:
            misses.append(f"{name}: {type(exc).__name__}")
            continue
        if name.endswith(".index.json"):
            weight_map = json.loads(path.read_text()).get("weight_map", {})
            for shard in sorted(set(weight_map.values())):
                download(shard)  # into the same snapshot folder, where the index's names point
        return resolve_checkpoint_files(path)
    found = []
    for name in TORCH_NAMES:
        if name not in names:
            try:
                from huggingface_hub import try_to_load_from_cache

                if isinstance(try_to_load_from_cache(repo_id, name, cache_dir=cache_dir, revision=revision), str):
                    found.append(name)
            except ValueError:
                pass
    raise ValueError(_no_weights(repo_id, found) + f" (tried {'; '.join(misses)})")


def _no_weights(where: str, torch_files: list[str]) -> str:
    if torch_files:
        return (
            f"{where!r} holds only pickled weights ({', '.join(torch_files)}); pass use_safetensors=False to "
            "read them (with torch.load(weights_only=True)), or convert them to safetensors"
        )
    return f"{where!r} holds no model.safetensors or model.safetensors.index.json"
