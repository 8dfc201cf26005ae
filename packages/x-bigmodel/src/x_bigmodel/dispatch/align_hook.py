"""The hook ``dispatch_model`` puts on a module: inputs to its execution device, offloaded weights
in for the forward and out after, outputs to where the caller wants them."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.device_moves import find_device, send_to_device
from x_bigmodel.dispatch.hooks import ModelHook
from x_bigmodel.offload.blocks import OffloadedBlock, Source
from x_bigmodel.offload.prefetch import Prefetcher
from x_bigmodel.offload.weights import MemoryWeight

__all__ = ["AlignDevicesHook"]


class AlignDevicesHook(ModelHook):
    """Runs a module on ``execution_device``.

    Args:
        execution_device: inputs are moved here before the forward (``None``: left where they are).
        io_same_device: return outputs on the device the inputs came on (transformers sets this on
            an encoder's hook during ``generate``).
        skip_keys: keyword arguments (and mapping keys) never moved, e.g. a KV cache object.
        output_device: return outputs here (wins over ``io_same_device``).
        block: weights brought in for each forward and released after it.
        prefetcher: hands out the block's weights, fetching the next block's in the background; the
            hook that owns it (on the root module) shuts it down when removed.
    """

    def __init__(
        self,
        execution_device: torch.device | None = None,
        io_same_device: bool = False,
        skip_keys: Collection[str] = (),
        output_device: torch.device | None = None,
        block: OffloadedBlock | None = None,
        prefetcher: Prefetcher | None = None,
        owns_prefetcher: bool = False,
    ) -> None:
        self.execution_device = execution_device
        self.io_same_device = io_same_device
        self.skip_keys = tuple(skip_keys)
        self.output_device = output_device
        self.block = block
        self.prefetcher = prefetcher
        self.owns_prefetcher = owns_prefetcher
        self._input_devices: list[torch.device | None] = []
        self._loaded: list[bool] = []
        # On the root hook: every hook of the dispatch, reset at the start of each forward, so that
        # a forward interrupted by KeyboardInterrupt (which skips post-forward) leaves nothing in.
        self.tracked: list[AlignDevicesHook] = []

    @property
    def offload(self) -> bool:
        return self.block is not None

    @property
    def weights_map(self) -> Mapping[str, torch.Tensor]:
        """The offloaded weights of this hook's block by name relative to its module, read on access
        (transformers' ``save_pretrained`` reads offloaded weights through it)."""
        return _WeightsMap(self.block.weights(self.block.name) if self.block is not None else {})

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


class _WeightsMap(Mapping[str, torch.Tensor]):
    def __init__(self, sources: dict[str, Source]) -> None:
        self._sources = sources

    def __getitem__(self, name: str) -> torch.Tensor:
        source = self._sources[name]
        if isinstance(source, MemoryWeight):
            return source.tensor
        return source.file.read(source.key).to(source.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)
