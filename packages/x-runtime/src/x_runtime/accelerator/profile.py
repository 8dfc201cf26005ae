"""``Accelerator.profile()``: ``torch.profiler`` around a block, one Chrome trace per rank.

A mixin of the facade. The options come from the ``ProfileKwargs`` passed to ``profile``, else
from the one among the accelerator's ``kwargs_handlers``, else the defaults (CPU, and the GPU
when there is one).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from x_runtime.accelerator.fields import AcceleratorFields
from x_runtime.core.configs import ProfileKwargs

__all__ = ["PROFILE_PATTERN_NAME", "ProfileMethods"]

PROFILE_PATTERN_NAME = "profile_{suffix}.json"


class ProfileMethods(AcceleratorFields):
    """``profile``, with the options of the accelerator's ``ProfileKwargs`` handler."""

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block; yields the ``torch.profiler.profile`` (call ``.step()`` with a schedule).

        With ``output_trace_dir`` set, every rank writes ``profile_<rank>.json`` there after the block.

        Examples:
            >>> from x_runtime import Accelerator
            >>> with Accelerator(cpu=True).profile() as prof:
            ...     _ = sum(range(10))
            >>> type(prof).__name__
            'profile'
        """
        handler = profile_handler or self.handlers.profile or ProfileKwargs()
        if self._memory_guard is not None:
            self._memory_guard.yield_profiler()  # torch runs one profiler at a time: the user's wins
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(
            os.path.join(handler.output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=self.process_state.rank))
        )
        self.process_state.wait_for_everyone()
