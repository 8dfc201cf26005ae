"""What Accelerate's loaders show on top of ``DataLoader``: ``DataLoaderStateMixin``, and the look of
a stateful loader.

:class:`DataLoaderStateMixin` is Accelerate's name for a loader that tracks ``end_of_dataloader``
and ``remainder`` and registers with a gradient state while it iterates (``begin``/``end``).

:class:`StatefulLook` lets a loader made with ``use_stateful_dataloader=True`` pass
``isinstance(loader, torchdata.stateful_dataloader.StatefulDataLoader)`` where torchdata is
installed, as Accelerate's loaders do (code written for Accelerate checks it before calling
``state_dict``). x's loaders keep their own resumable state and need no torchdata, so rather than
inheriting torchdata's iteration they report its class as ``__class__``, the attribute
``isinstance`` consults when the real type does not match; ``type(loader)`` stays x's class and
``isinstance(loader, DataLoaderShard)`` still holds. torchdata is imported only when a loader asks
for the stateful look. Pickle and ``copy`` would rebuild an object from ``__class__``, so
reduction is spelled out to rebuild the real type.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from x_runtime.data.gradient_state import GradientState

__all__ = ["DataLoaderStateMixin", "StatefulLook", "torchdata_class"]

_OBJECT_CLASS = object.__dict__["__class__"]  # the slot behind ``obj.__class__ = cls``


@functools.cache
def torchdata_class() -> type | None:
    """torchdata's ``StatefulDataLoader`` (None without torchdata 0.8 or newer); imported on first use."""
    from x_runtime.core.imports import is_torchdata_stateful_dataloader_available

    if not is_torchdata_stateful_dataloader_available():
        return None
    from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped,import-not-found,unused-ignore]

    return StatefulDataLoader


def _rebuild(cls: type) -> Any:
    """An empty instance of ``cls``, its state set by pickle or ``copy`` afterwards."""
    return cast("Any", cls).__new__(cls)


class _BaseDataLoader:
    """``loader.base_dataloader``: the ``DataLoader`` that loads the batches (the loader itself
    unless it set one); read on the class it raises ``AttributeError``, as Accelerate's does."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            raise AttributeError("base_dataloader is an attribute of a loader, not of its class")
        return obj.__dict__.get("base_dataloader", obj)


class StatefulLook:
    """Mixin: with ``use_stateful_dataloader`` set, the loader is also an instance of torchdata's
    ``StatefulDataLoader`` (where torchdata is installed)."""

    use_stateful_dataloader: bool
    base_dataloader: Any = _BaseDataLoader()

    @property
    def __class__(self) -> type:
        real = type(self)
        if self.__dict__.get("use_stateful_dataloader"):
            return torchdata_class() or real
        return real

    @__class__.setter
    def __class__(self, value: type) -> None:
        _OBJECT_CLASS.__set__(self, value)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        getstate = getattr(self, "__getstate__", None)  # object has one from Python 3.11
        return (_rebuild, (type(self),), getstate() if getstate is not None else self.__dict__)


class DataLoaderStateMixin:
    """Accelerate's mixin of loaders that know where they stand in an epoch.

    Attributes:
        end_of_dataloader: True while the last batch of the epoch is handed out.
        remainder: Real (not padding) samples of the last global batch; ``-1`` when unknown.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    gradient_state: GradientState

    def reset(self) -> None:
        """Forget the last epoch's end: not at the end, remainder unknown."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Reset, and register with ``gradient_state`` as its active loader."""
        self.reset()
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """Unregister from ``gradient_state`` (a loop that stops before the epoch's end)."""
        self.gradient_state._remove_dataloader(self)
