"""An explicit ``stacklevel`` counts from the adapter's own ``log``, as Accelerate's does: a wrapper
around the adapter that sets it names its caller, not one frame further up."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from x_runtime import get_logger


class _Wrapper(logging.LoggerAdapter):
    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["stacklevel"] = 3  # the adapter's log, this method, then whoever called warning()
        self.logger.log(level, msg, *args, **kwargs)


def test_wrapper_stacklevel_names_the_wrappers_caller(caplog: pytest.LogCaptureFixture) -> None:
    inner = get_logger("xr.stacklevel")
    with caplog.at_level(logging.INFO, logger="xr.stacklevel"):
        _Wrapper(inner, {}).warning("wrapped")  # type: ignore[arg-type]
        inner.info("ordered", in_order=True, stacklevel=1)  # the adapter's own log frame
    wrapped, ordered = [r for r in caplog.records if r.name == "xr.stacklevel"]
    assert (wrapped.filename, wrapped.funcName) == (
        "test_logging_stacklevel.py",
        "test_wrapper_stacklevel_names_the_wrappers_caller",
    )
    assert (ordered.filename, ordered.funcName) == ("logging.py", "log")
