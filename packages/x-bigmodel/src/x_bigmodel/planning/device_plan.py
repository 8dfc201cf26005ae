"""``DevicePlan``: a device map resolved once, what the loader and the dispatcher both read.

A user's ``device_map`` (a ``DeviceMap`` dict, or a strategy name that ``x_bigmodel.planning.device_map``
plans) becomes a ``DevicePlan`` at the public entry point. Its values are canonical device keys
(``"cuda:1"`` is ``1``), and it answers the one question both consumers ask: which entry, hence
which device, holds a tensor (the longest dotted prefix of its name; ``""`` is the whole model).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

from x_bigmodel.devices.device_keys import OFFLOAD_TARGETS, DeviceKey, check_devices_exist, device_key
from x_bigmodel.devices.tensor_placement import as_device
from x_common.module_sizes import tensor_infos

__all__ = ["DeviceMap", "DevicePlan", "check_device_map"]

# What users pass: module or tensor name -> GPU index, "cuda:1", torch.device, "mps", "cpu", "disk".
DeviceMap = Mapping[str, int | str | torch.device]


@dataclass(frozen=True, kw_only=True)
class DevicePlan:
    """Module (or tensor) name -> canonical device key, and where disk-offloaded weights are saved.

    Build one with ``DevicePlan.from_map`` (values normalised, names unchecked), ``check_device_map``
    (checked against a model) or ``x_bigmodel.planning.device_map.plan_device_map`` (a dict or a strategy).

    Examples:
        >>> plan = DevicePlan.from_map({"": "cpu", "1": "cuda:0", "1.bias": "disk"})
        >>> plan.device_for("1.weight"), plan.device_for("1.bias"), plan.device_for("0.weight")
        (0, 'disk', 'cpu')
        >>> plan.as_dict()
        {'': 'cpu', '1': 0, '1.bias': 'disk'}
    """

    entries: Mapping[str, DeviceKey] = field(default_factory=dict)
    offload_folder: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", MappingProxyType(dict(self.entries)))

    @classmethod
    def from_map(
        cls, device_map: DeviceMap | DevicePlan, offload_folder: str | os.PathLike[str] | None = None
    ) -> DevicePlan:
        """A plan from a user's map, each value normalised; names are not checked against a model.

        A ``DevicePlan`` is returned as is, with ``offload_folder`` when one is given.

        Raises:
            ValueError: a value names no device (``device_map['name']: invalid device ...``).
        """
        if isinstance(device_map, DevicePlan):
            return device_map if offload_folder is None else replace(device_map, offload_folder=offload_folder)
        entries: dict[str, DeviceKey] = {}
        for key, value in device_map.items():
            try:
                entries[key] = device_key(value)
            except ValueError as exc:
                raise ValueError(f"device_map[{key!r}]: {exc}") from None
        return cls(entries=entries, offload_folder=offload_folder)

    def entry_for(self, name: str) -> str | None:
        """The entry that places ``name``: its longest dotted prefix in the map (``""`` matches all)."""
        prefix = name
        while prefix not in self.entries:
            if not prefix:
                return None
            prefix = prefix.rpartition(".")[0]
        return prefix

    def device_for(self, name: str) -> DeviceKey:
        """The device key of the entry that places ``name`` (see ``entry_for``).

        Raises:
            ValueError: no entry places ``name``.
        """
        entry = self.entry_for(name)
        if entry is None:
            raise ValueError(f"{name} has no device in device_map (no entry for it or any module containing it)")
        return self.entries[entry]

    @property
    def devices(self) -> tuple[DeviceKey, ...]:
        """The distinct devices of the map, in the order they first appear."""
        return tuple(dict.fromkeys(self.entries.values()))

    @property
    def accelerators(self) -> tuple[DeviceKey, ...]:
        """The devices modules run on themselves (GPUs, ``"mps"``), in order of appearance."""
        return tuple(d for d in self.devices if d not in OFFLOAD_TARGETS)

    @property
    def uses_disk(self) -> bool:
        """Whether any entry is on ``"disk"``."""
        return "disk" in self.entries.values()

    def main_device(self) -> torch.device:
        """Where ``"cpu"`` and ``"disk"`` entries run by default: the first accelerator, else the CPU."""
        accelerators = self.accelerators
        return as_device(accelerators[0]) if accelerators else torch.device("cpu")

    def check_present(self) -> None:
        """Refuse a plan naming a device this process does not have, before any weight moves.

        A plan may be made for another machine; loading or dispatching it needs its devices here.

        Raises:
            ValueError: ``device_map['lm_head'] is GPU 7, but ...; the devices here are ...``.
        """
        check_devices_exist((f"device_map[{name!r}]", key) for name, key in self.entries.items())

    def as_dict(self) -> dict[str, DeviceKey]:
        """The map as a plain dict (what ``model.hf_device_map`` holds)."""
        return dict(self.entries)


def check_device_map(
    model: torch.nn.Module, device_map: DeviceMap, offload_folder: str | os.PathLike[str] | None = None
) -> DevicePlan:
    """A plan from ``device_map``, checked against ``model``.

    Every key must name a module or tensor of ``model`` (``""`` is the whole model), every parameter
    and buffer must be placed by a key, and tensors shared between modules must land on one device.

    Raises:
        ValueError: an unknown name (the nearest valid one is suggested), an invalid device,
            unplaced tensors, or tied tensors on different devices.
    """
    infos = tensor_infos(model)
    valid = {name for name, _ in model.named_modules(remove_duplicate=False)}
    valid.update(name for info in infos for name in info.names)
    entries: dict[str, DeviceKey] = {}
    for key, value in device_map.items():
        if not isinstance(key, str) or key not in valid:
            near = difflib.get_close_matches(str(key), sorted(valid - {""}), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"device_map names {key!r}, which is not a module or tensor of the model{hint}")
        try:
            entries[key] = device_key(value)
        except ValueError as exc:
            raise ValueError(f"device_map[{key!r}]: {exc}") from None
    plan = DevicePlan(entries=entries, offload_folder=offload_folder)

    uncovered: list[str] = []
    for info in infos:
        # The most specific entry wins, so a map may override one child of a mapped parent.
        devices: dict[str, Any] = {}
        for name in info.names:
            entry = plan.entry_for(name)
            devices[name] = None if entry is None else entries[entry]
        uncovered.extend(name for name, device in devices.items() if device is None)
        placed = {d for d in devices.values() if d is not None}
        if len(placed) > 1:
            raise ValueError(
                f"tensor shared as {', '.join(info.names)} is mapped to different devices "
                f"({', '.join(f'{n}: {d!r}' for n, d in devices.items())}); a shared tensor lives on one device"
            )
    if uncovered:
        shown = ", ".join(uncovered[:10]) + (f" and {len(uncovered) - 10} more" if len(uncovered) > 10 else "")
        raise ValueError(f"device_map does not place {shown}; add them (or a parent module) to the map")
    return plan
