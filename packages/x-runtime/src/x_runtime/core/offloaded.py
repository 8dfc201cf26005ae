"""The weights of a model whose parameters were offloaded (meta tensors), read back from their hooks.

A model dispatched over devices with some weights in RAM or on disk (``x_bigmodel.dispatch_model``,
Accelerate's ``dispatch_model``, ``device_map="auto"`` in transformers) holds those parameters as
meta tensors; the real values sit behind the module's hook, in its ``weights_map`` (the attribute
Accelerate's ``AlignDevicesHook`` and x-bigmodel's both have, which transformers' ``save_pretrained``
reads too). ``state_dict_of`` is ``model.state_dict()`` with each such entry replaced by its value,
so ``save_model``, ``get_state_dict`` and ``save_state`` write real weights, as Accelerate's do.
Nothing of x-bigmodel is imported: any hook with a ``weights_map`` answers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = ["state_dict_of"]


def state_dict_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()``, with offloaded (meta) entries read from the hooks that hold them.

    Raises:
        ValueError: an entry is on the meta device and no hook holds its value (a skeleton from
            ``init_empty_weights`` never loaded); the message names it.

    Examples:
        >>> state_dict_of(torch.nn.Linear(2, 1)).keys()
        dict_keys(['weight', 'bias'])
    """
    weights: dict[str, torch.Tensor] = model.state_dict()
    missing = {name for name, tensor in weights.items() if tensor.is_meta}
    if not missing:
        return weights
    aliases = _aliases(model)  # a tied weight is offloaded once, under one of its names
    for prefix, weights_map in _weights_maps(model):
        for key in list(weights_map):
            if prefix and key.startswith(f"{prefix}.") and f"{prefix}.{key}" not in weights:
                # Accelerate's weights map (a PrefixedDataset) lists whole names, read by relative ones.
                name, relative = key, key[len(prefix) + 1 :]
            else:
                name, relative = (f"{prefix}.{key}" if prefix else key), key
            wanted = [alias for alias in aliases.get(name, (name,)) if alias in missing]
            if wanted:
                value = weights_map[relative]  # read once (from disk, for a disk-offloaded weight)
                for alias in wanted:
                    weights[alias] = value
                    missing.discard(alias)
    if missing:
        first = sorted(missing)[0]
        raise ValueError(
            f"{first} (and {len(missing) - 1} more) is on the meta device and no hook of the model holds its "
            "value: load the weights first (load_checkpoint_in_model, load_checkpoint_and_dispatch)"
        )
    return weights


def _weights_maps(model: torch.nn.Module) -> Iterator[tuple[str, Mapping[str, torch.Tensor]]]:
    for prefix, module in model.named_modules(remove_duplicate=False):
        hook: Any = getattr(module, "_hf_hook", None)
        for part in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):  # a SequentialHook's
            weights_map = getattr(part, "weights_map", None)
            if isinstance(weights_map, Mapping) and len(weights_map):
                yield prefix, weights_map


def _aliases(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """Every name of each tensor held under several names (tied weights), by each of its names."""
    names: dict[int, list[str]] = {}
    for name, tensor in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        names.setdefault(id(tensor), []).append(name)
    return {name: tuple(group) for group in names.values() if len(group) > 1 for name in group}
