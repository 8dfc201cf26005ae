"""The hook ``dispatch_model`` puts on a module: inputs to its execution device, offloaded weights
in for the forward and out after, outputs to where the caller wants them."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.device_moves import find_device, send_to_device
from x_bigmodel.devices.tensor_placement import as_device, owner_of, set_module_tensor_to_device
from x_bigmodel.dispatch.hooks import ModelHook
from x_bigmodel.dispatch.tensor_sources import meta_like
from x_bigmodel.offload.blocks import OffloadedBlock, Source, WeightGroup
from x_bigmodel.offload.prefetch import Prefetcher
from x_bigmodel.offload.weights import MemoryWeight, source_value

__all__ = ["AlignDevicesHook"]


class AlignDevicesHook(ModelHook):
    """Runs a module on ``execution_device``, with Accelerate's arguments.

    Args:
        execution_device: inputs are moved here before the forward (``None``: left where they are).
        offload: keep the module's weights off the device between forwards: they become meta tensors,
            brought onto ``execution_device`` for each forward (from ``weights_map``, or from where they
            are when the hook is added) and put back where they were when the hook is removed.
        io_same_device: return outputs on the device the inputs came on (transformers sets this on
            an encoder's hook during ``generate``).
        weights_map: the offloaded weights by name relative to the module (a state dict, or an
            ``OffloadedWeightsLoader`` reading them from an offload folder).
        offload_buffers: offload the buffers too; by default they are put on ``execution_device``.
        place_submodules: the weights of the whole subtree, not only the module's own.
        skip_keys: keyword arguments (and mapping keys) never moved, e.g. a KV cache object.
        tied_params_map: accepted for Accelerate's signature; tied weights are shared anyway (one
            tensor brought in under all of its names).
        output_device: return outputs here (wins over ``io_same_device``).
        block: weights brought in for each forward and released after (``dispatch_model``'s).
        prefetcher: hands out the block's weights, fetching the next block's in the background; the
            hook that owns it (on the root module) shuts it down when removed.
        place_weights: with ``offload=False``, move the module's weights to ``execution_device`` when
            the hook is added (as Accelerate does); ``dispatch_model`` has placed them already.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | Collection[str] | None = None,
        tied_params_map: Mapping[Any, Any] | None = None,
        *,
        output_device: torch.device | None = None,
        block: OffloadedBlock | None = None,
        prefetcher: Prefetcher | None = None,
        owns_prefetcher: bool = False,
        place_weights: bool = True,
    ) -> None:
        self.execution_device = as_device(execution_device) if execution_device is not None else None
        self._offload = offload
        self.io_same_device = io_same_device
        self._weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys: tuple[str, ...] = (skip_keys,) if isinstance(skip_keys, str) else tuple(skip_keys or ())
        self.tied_params_map = tied_params_map
        self.output_device = output_device
        self.block = block
        self.prefetcher = prefetcher
        self.owns_prefetcher = owns_prefetcher
        self.place_weights = place_weights
        self._input_devices: list[torch.device | None] = []
        self._loaded: list[bool] = []
        # On the root hook: every hook of the dispatch, reset at the start of each forward, so that
        # a forward interrupted by KeyboardInterrupt (which skips post-forward) leaves nothing in.
        self.tracked: list[AlignDevicesHook] = []

    @property
    def offload(self) -> bool:
        return self._offload or self.block is not None

    def init_hook(self, module: nn.Module) -> nn.Module:
        if self.block is not None:
            return module  # dispatch_model's: the weights are placed already
        if self._offload:
            self.block = _offload_block(module, self)
            self.block.release(pages=False)  # meta tensors in the slots until a forward
        elif self.place_weights and self.execution_device is not None:
            for name, tensor in _module_tensors(module, self.place_submodules, buffers=True):
                if tensor.device.type != "meta":
                    set_module_tensor_to_device(module, name, self.execution_device)
        if self._offload and not self.offload_buffers and self.execution_device is not None:
            for name, buffer in module.named_buffers(recurse=self.place_submodules):
                if buffer.device.type != "meta":
                    set_module_tensor_to_device(module, name, self.execution_device)
        return module

    @property
    def weights_map(self) -> Mapping[str, torch.Tensor]:
        """The offloaded weights of this hook's block by name relative to its module, read on access
        (transformers' ``save_pretrained`` reads offloaded weights through it)."""
        if self.block is None:
            return self._weights_map if self._weights_map is not None else _WeightsMap({})
        return _WeightsMap(self.block.weights(self.block.name))

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        for hook in self.tracked:
            hook.reset()
        if self.io_same_device:
            self._input_devices.append(find_device((args, kwargs)))
        self._loaded.append(False)
        block = self.block
        if block is not None:
            if block.depth == 0:
                block.install(self.prefetcher.acquire(block) if self.prefetcher is not None else block.fetch())
            block.depth += 1
            self._loaded[-1] = True
        if self.execution_device is not None:
            args = send_to_device(args, self.execution_device, self.skip_keys)
            kwargs = {
                key: value if key in self.skip_keys else send_to_device(value, self.execution_device, self.skip_keys)
                for key, value in kwargs.items()
            }
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        # Also runs when the forward raised (the hook is registered with always_call=True).
        if self._loaded and self._loaded.pop() and self.block is not None:
            self.block.depth -= 1
            if self.block.depth == 0:
                if self.prefetcher is not None:
                    self.prefetcher.release(self.block)
                else:
                    self.block.release()
        input_device = self._input_devices.pop() if self._input_devices else None
        target = self.output_device or (input_device if self.io_same_device else None)
        if target is not None and output is not None:
            output = send_to_device(output, target, self.skip_keys)
        return output

    def reset(self) -> None:
        self._input_devices.clear()
        self._loaded.clear()
        if self.block is not None:
            self.block.reset(self.prefetcher.pages if self.prefetcher is not None else None)

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.block is not None:
            for handle in self.block.handles:
                handle.remove()
            self.block.handles.clear()
            self.block.restore()
        if self.owns_prefetcher and self.prefetcher is not None:
            self.prefetcher.close()
        return module


def _module_tensors(module: nn.Module, recurse: bool, buffers: bool) -> list[tuple[str, torch.Tensor]]:
    named: list[tuple[str, torch.Tensor]] = list(module.named_parameters(recurse=recurse, remove_duplicate=False))
    if buffers:
        named += [(n, b) for n, b in module.named_buffers(recurse=recurse, remove_duplicate=False) if b is not None]
    return named


def _offload_block(module: nn.Module, hook: AlignDevicesHook) -> OffloadedBlock:
    """The block of an Accelerate-style offloading hook: the module's weights (its subtree's with
    ``place_submodules``, buffers with ``offload_buffers``), each tensor once under all its names,
    valued from the hook's ``weights_map`` or from where the tensor is now."""
    weights_map = hook._weights_map
    by_id: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, tensor in _module_tensors(module, hook.place_submodules, buffers=hook.offload_buffers):
        by_id.setdefault(id(tensor), ([], tensor))[0].append(name)
    groups: list[WeightGroup] = []
    devices: list[torch.device] = []
    for names, tensor in by_id.values():
        source: Source
        known = [n for n in names if weights_map is not None and n in weights_map]
        if known and weights_map is not None:
            reader = getattr(weights_map, "source", None)
            source = reader(known[0]) if reader is not None else MemoryWeight(weights_map[known[0]])
        elif tensor.device.type != "meta":
            source = MemoryWeight(tensor.detach().to("cpu"))
            devices.append(tensor.device)
        else:
            raise ValueError(
                f"{names[0]} is on the meta device and not in weights_map: the hook has no value to bring in"
            )
        groups.append(
            WeightGroup(
                names=names,
                slots=[owner_of(module, n) for n in names],
                template=meta_like(tensor, tensor.dtype),
                source=source,
                original_device=tensor.device if tensor.device.type != "meta" else None,
            )
        )
    device = hook.execution_device or (devices[0] if devices else torch.device("cpu"))
    return OffloadedBlock("", groups, device)


class _WeightsMap(Mapping[str, torch.Tensor]):
    def __init__(self, sources: dict[str, Source]) -> None:
        self._sources = sources

    def __getitem__(self, name: str) -> torch.Tensor:
        return source_value(self._sources[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)
