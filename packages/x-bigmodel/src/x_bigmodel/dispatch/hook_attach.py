"""The hooks ``dispatch_model`` puts on a model: where each entry runs, and who brings weights in.

Every module that runs a device-map entry moves its inputs to that entry's execution device when
the model spans several; each offloaded block's module gets its weights brought in (and the next
block's prefetched), and the submodules inside it that alone use some of its file-mapped weights
hand those back as soon as they have run; the root hook returns outputs on the output device and
owns the prefetcher.
"""

from __future__ import annotations

import torch
from torch import nn

from x_bigmodel.devices.device_keys import run_device
from x_bigmodel.dispatch.align_hook import AlignDevicesHook
from x_bigmodel.dispatch.hooks import add_hook_to_module
from x_bigmodel.dispatch.tensor_sources import is_module
from x_bigmodel.offload.blocks import OffloadedBlock, WeightGroup
from x_bigmodel.offload.prefetch import Prefetcher
from x_bigmodel.planning.device_plan import DevicePlan

__all__ = ["attach_hooks", "called_modules"]


def attach_hooks(
    model: nn.Module,
    plan: DevicePlan,
    main: torch.device,
    output: torch.device,
    blocks: list[OffloadedBlock],
    skip: tuple[str, ...],
    *,
    prefetch: bool,
) -> None:
    """Hook ``model`` to run as ``plan`` says, offloaded entries on ``main``, outputs on ``output``."""
    if prefetch and len(blocks) > 1:  # without a prefetch, nothing waits for the pages handed back early
        for block in blocks:
            block.leaves = block.leaf_groups(model.get_submodule(block.name))
    prefetcher = Prefetcher(blocks, enabled=prefetch) if blocks else None
    run_devices = {run_device(device, main) for device in plan.entries.values()}
    hooks: dict[str, AlignDevicesHook] = {}
    if len(run_devices) > 1:
        # Inputs cross devices between entries: each entry moves its inputs to where it runs.
        for entry, device in plan.entries.items():
            for name in called_modules(model, entry):
                hooks[name] = AlignDevicesHook(run_device(device, main), skip_keys=skip, place_weights=False)
    for block in blocks:
        hook = hooks.setdefault(block.name, AlignDevicesHook(block.device, skip_keys=skip, place_weights=False))
        hook.execution_device = block.device
        hook.block, hook.prefetcher = block, prefetcher
    root = hooks.setdefault("", AlignDevicesHook(None, skip_keys=skip, place_weights=False))
    if len(run_devices) == 1:
        root.execution_device = next(iter(run_devices))
    root.output_device = output
    root.prefetcher, root.owns_prefetcher = root.prefetcher or prefetcher, True
    root.tracked = list(hooks.values())
    for name, hook in hooks.items():
        add_hook_to_module(model.get_submodule(name), hook)
    if prefetcher is not None:
        for block in blocks:
            for leaf, groups in block.leaves.items():
                handle = leaf.register_forward_hook(_HandBack(prefetcher, block, groups), always_call=True)
                block.handles.append(handle)


class _HandBack:
    """A forward hook on a submodule of an offloaded block: once it has run, the pages of the
    weights only it uses go back, so the next block's prefetch can map its own in meanwhile."""

    def __init__(self, prefetcher: Prefetcher, block: OffloadedBlock, groups: list[WeightGroup]) -> None:
        self.prefetcher, self.block, self.groups = prefetcher, block, groups

    def __call__(self, module: nn.Module, args: object, output: object) -> None:
        finished = self.block.finished(self.groups)
        if finished:
            self.prefetcher.release(self.block, finished)


def called_modules(model: nn.Module, entry: str) -> list[str]:
    """The modules whose calls run entry ``entry``: the entry itself, but a ``ModuleList`` or
    ``ModuleDict`` is never called, so its children stand in for it; a tensor entry, its module."""
    if not is_module(model, entry):
        return [entry.rpartition(".")[0]]
    module = model.get_submodule(entry)
    if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
        return [entry]
    prefix = f"{entry}." if entry else ""
    return [n for child, _ in module.named_children() for n in called_modules(model, prefix + child)]
