"""Checkpoint key names as transformers maps them, using transformers' own conversion tables.

transformers 5 renames checkpoint keys at load time (base-model prefix added or stripped, legacy
names such as ``LayerNorm.gamma``, ``block_sparse_moe`` -> ``mlp``) and converts some tensors
(per-expert MoE weights stacked into one fused tensor). Both come from
``get_model_conversion_mapping`` (through ``key_tables``) and ``rename_source_key``, applied here the way
``convert_and_load_state_dict_in_model`` applies them, so that a checkpoint loads under the names
transformers would give it. Renamed keys are read by x-bigmodel's loader in place; converted
ones are materialised by transformers' ``WeightConverter`` (see ``conversions``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from x_bigmodel.transformers.key_tables import model_conversions

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["KeyMapping", "LoadReport", "map_checkpoint_keys", "report_keys"]


@dataclass
class KeyMapping:
    """Where each checkpoint key goes in the model.

    ``names``: checkpoint key -> model name, for keys read as they are. ``conversions``: the first
    target name -> a ``WeightConverter`` and its ``(source_pattern, checkpoint key)`` inputs, in
    transformers' natural key order (experts 0, 1, ..., 10). ``produced``: every model name a
    conversion fills. ``unexpected``: renamed checkpoint keys the model does not have.
    """

    names: dict[str, str] = field(default_factory=dict)
    conversions: dict[str, tuple[Any, list[tuple[str, str]]]] = field(default_factory=dict)
    produced: set[str] = field(default_factory=set)
    unexpected: set[str] = field(default_factory=set)


@dataclass
class LoadReport:
    """Missing and unexpected keys after transformers' own exceptions (tied weights, ignore patterns)."""

    missing: set[str]
    unexpected: set[str]


def map_checkpoint_keys(model: PreTrainedModel, keys: Iterable[str]) -> KeyMapping:
    """Map ``keys`` (every key of the checkpoint) onto ``model``'s state-dict names, as transformers does."""
    from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key

    transforms = model_conversions(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {pattern: conv for conv in converters for pattern in conv.source_patterns}
    prefix = model.base_model_prefix
    meta = model.state_dict()
    mapping = KeyMapping()
    for key in sorted(keys, key=dot_natural_key):
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, meta)
        if renamed not in meta and key in meta:
            # The key was right as it was: only a prefix may be needed (transformers' own fallback).
            renamed, pattern = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=meta)
        if renamed in meta:
            if pattern is None:
                mapping.names[key] = renamed
                continue
            converter = by_pattern[pattern]
            if renamed not in mapping.conversions:
                # Each target collects its own inputs, as transformers deep-copies a converter per target.
                mapping.conversions[renamed] = (copy.deepcopy(converter), [])
                mapping.produced.update(
                    renamed.replace(converter.target_patterns[0], t) for t in converter.target_patterns
                )
            mapping.conversions[renamed][1].append((pattern, key))
        elif pattern is not None:
            converter = by_pattern[pattern]
            mapping.unexpected.update(
                renamed.replace(converter.target_patterns[0], t) for t in converter.target_patterns
            )
        else:
            mapping.unexpected.add(renamed)
    return mapping


def report_keys(model: PreTrainedModel, mapping: KeyMapping) -> LoadReport:
    """Tie ``model``'s weights the class's way, then list what the checkpoint leaves missing or unused.

    Tying is transformers' own (``tie_weights`` with the missing keys, so a checkpoint holding only
    the head ties the embedding to it); the ignore patterns are the model's
    (``_adjust_missing_and_unexpected_keys``). Non-persistent buffers are not in the state dict and
    are never missing.
    """
    from transformers.utils.loading_report import LoadStateDictInfo

    loaded = set(mapping.names.values()) | mapping.produced
    missing = {name for name in model.state_dict() if name not in loaded}
    if hasattr(model, "all_tied_weights_keys"):
        model.tie_weights(missing_keys=missing, recompute_mapping=False)
    info = LoadStateDictInfo(
        missing_keys=missing,
        unexpected_keys=set(mapping.unexpected),
        mismatched_keys=set(),
        conversion_errors={},
        error_msgs=[],
        skipped_pp_keys=set(),
    )
    model._adjust_missing_and_unexpected_keys(info)
    return LoadReport(missing=set(info.missing_keys), unexpected=set(info.unexpected_keys))
