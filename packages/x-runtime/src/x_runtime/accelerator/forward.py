"""Read-through attributes: ``Accelerator.num_processes`` is ``accelerator.state.world_size``.

The facade exposes Accelerate's attribute names over the small objects that hold the values;
one descriptor per name replaces a property method each.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Forward"]


class Forward:
    """``Forward("state", "world_size")``: reads ``obj.state.world_size``; ``writable`` also sets it."""

    def __init__(self, holder: str, name: str, *, writable: bool = False, doc: str | None = None) -> None:
        self.holder, self.name, self.writable = holder, name, writable
        self.__doc__ = doc or f"Same as ``{holder}.{name}``."

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.holder), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.writable:
            raise AttributeError(f"{self.name} is read-only; it comes from {self.holder}")
        setattr(getattr(obj, self.holder), self.name, value)
