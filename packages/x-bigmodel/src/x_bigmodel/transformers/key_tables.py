"""transformers' key conversion table for one model, without building every model type's.

``get_model_conversion_mapping`` reads a table built on first use for all ~260 model types: about
1,100 ``WeightRenaming``/``WeightConverter`` objects, each compiling its regular expression. That
build is half of a warm ``from_pretrained`` of a 3 GB Llama (0.05-0.1 s on 2 cores), though a
model needs a handful of entries (Llama: the legacy renames alone).

``model_conversions`` runs the same two functions of transformers with different global names, so
nothing of transformers' changes: the table's builder runs with its transform classes recorded
instead of constructed, and only the entries the model asks for are constructed, with the same
arguments, when asked. The result is what ``get_model_conversion_mapping(model)`` returns. When
transformers has already built its table (an earlier load in this process, a registered mapping),
or its code is not shaped as expected, transformers' own function runs.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from typing import Any

__all__ = ["model_conversions"]


def model_conversions(model: Any) -> list[Any]:
    """``transformers.conversion_mapping.get_model_conversion_mapping(model)``, built for this model only."""
    from transformers import conversion_mapping

    getter = _lazy_getter(conversion_mapping)
    if getter is None:
        return conversion_mapping.get_model_conversion_mapping(model)
    function = conversion_mapping.get_model_conversion_mapping
    scope = {**vars(conversion_mapping), "get_checkpoint_conversion_mapping": getter}
    lazy = types.FunctionType(function.__code__, scope, function.__name__, function.__defaults__, function.__closure__)
    lazy.__kwdefaults__ = function.__kwdefaults__
    return lazy(model)


def _lazy_getter(module: types.ModuleType) -> Callable[[str], Any] | None:
    """A ``get_checkpoint_conversion_mapping`` over a table whose entries are built on first read;
    ``None`` when transformers' own table exists already or its builder does not run this way."""
    build = getattr(module, "_build_checkpoint_conversion_mapping", None)
    base = getattr(module, "WeightTransform", None)
    if getattr(module, "_checkpoint_conversion_mapping_cache", "absent") is not None or build is None or base is None:
        return None
    scope = dict(vars(module))
    for name, value in vars(module).items():
        if isinstance(value, type) and issubclass(value, base):
            scope[name] = _Recorder(value)
    try:
        recorded = types.FunctionType(build.__code__, scope, build.__name__)()
    except Exception:  # a builder this module does not understand: transformers' own table then
        return None
    if not isinstance(recorded, dict):
        return None

    def get(model_type: str) -> Any:
        entry = recorded.get(model_type)
        return None if entry is None else copy.deepcopy(_construct(entry))

    return get


class _Call:
    """One recorded construction, made when the table is read (or when the builder reads it)."""

    __slots__ = ("_made", "arguments", "cls", "keywords")

    def __init__(self, cls: type, arguments: tuple[Any, ...], keywords: dict[str, Any]) -> None:
        self.cls, self.arguments, self.keywords, self._made = cls, arguments, keywords, None

    def made(self) -> Any:
        # Once: the table shares one object between model types, as transformers' own does.
        if self._made is None:
            self._made = self.cls(*_construct(self.arguments), **_construct(self.keywords))
        return self._made

    def __getattr__(self, name: str) -> Any:
        # The builder derives some entries from others (Tipsv2's from its depth head's patterns).
        return getattr(self.made(), name)


class _Recorder:
    __slots__ = ("cls",)

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __call__(self, *arguments: Any, **keywords: Any) -> _Call:
        return _Call(self.cls, arguments, keywords)


def _construct(value: Any) -> Any:
    """``value`` with every recorded call made."""
    if isinstance(value, _Call):
        return value.made()
    if isinstance(value, list):
        return [_construct(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_construct(item) for item in value)
    if isinstance(value, dict):
        return {k: _construct(v) for k, v in value.items()}
    return value
