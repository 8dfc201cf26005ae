"""Runs one sub-test of a generated Accelerate test script and records what happened.

Copied beside the generated scripts (as ``x_compat_harness``); the generator turns each sub-test
call in a script's ``main()`` into ``run(func, sources, *args)``. Each rank appends one JSON line
per event to ``$X_COMPAT_RESULTS/rank<R>.jsonl``: START, then PASS or FAIL. A failing or hanging
sub-test ends the process at once (``os._exit``): its collectives would otherwise leave the other
ranks waiting, and the runner starts a fresh launch that skips what is already decided
(``$X_COMPAT_SKIP``). Only the standard library is used, so it runs under any implementation.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

# Only flags name a case by value (loop variables such as split_batches=True); anything else is
# named by its source text, so that a rank-dependent number cannot give ranks different names.
_SIMPLE = (bool, type(None))
_seen: Counter[str] = Counter()


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _record(event: str, subtest: str, detail: str = "") -> None:
    folder = os.environ.get("X_COMPAT_RESULTS")
    if not folder:
        return
    line = json.dumps({"event": event, "id": subtest, "detail": detail, "rank": _rank()})
    with open(os.path.join(folder, f"rank{_rank()}.jsonl"), "a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def _describe(func: Any, sources: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    shown = [repr(v) if isinstance(v, _SIMPLE) else s for s, v in zip(sources[: len(args)], args, strict=True)]
    shown += [
        f"{k}={v!r}" if isinstance(v, _SIMPLE) else f"{k}={sources[len(args) + i]}"
        for i, (k, v) in enumerate(kwargs.items())
    ]
    base = f"{func.__name__}({', '.join(shown)})"
    _seen[base] += 1
    return base if _seen[base] == 1 else f"{base}#{_seen[base]}"


def _timed_out(subtest: str, limit: float) -> None:
    _record("FAIL", subtest, f"timeout: still running after {limit:.0f} s")
    sys.stderr.write(f"[compat] {subtest} timed out after {limit:.0f} s\n")
    sys.stderr.flush()
    os._exit(124)


def run(func: Any, sources: tuple[str, ...], *args: Any, **kwargs: Any) -> Any:
    """Run ``func(*args, **kwargs)`` as one sub-test unless the runner has already decided it."""
    subtest = _describe(func, sources, args, kwargs)
    if subtest in set(json.loads(os.environ.get("X_COMPAT_SKIP", "[]"))):
        return None
    limit = float(os.environ.get("X_COMPAT_TIMEOUT", "180"))
    _record("START", subtest)
    watchdog = threading.Timer(limit, _timed_out, (subtest, limit))
    watchdog.daemon = True
    watchdog.start()
    started = time.monotonic()
    try:
        result = func(*args, **kwargs)
    except BaseException as error:  # SystemExit and KeyboardInterrupt end a sub-test too
        watchdog.cancel()
        message = str(error).strip().splitlines()
        _record("FAIL", subtest, f"{type(error).__name__}: {message[0] if message else ''}"[:300])
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(3)
    watchdog.cancel()
    _record("PASS", subtest, f"{time.monotonic() - started:.1f} s")
    return result


class Missing:
    """Stands for a name x does not have: importing works, using it fails the sub-test that does."""

    def __init__(self, name: str):
        self._name = name

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"x has no equivalent of {self._name}")

    __call__ = _fail

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        self._fail()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        self._fail()
        return ()
