"""``patch_environment`` and ``clear_environment``: the environment changed for the length of a block, as
Accelerate's are; ``convert_dict_to_env_variables``: variables as lines of an environment file."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
# Variables a call may set for the launcher or runtime (transformers sets ACCELERATE_MIXED_PRECISION, for one).
_PREFIXES = ("ACCELERATE_", "X_")
_WRAPPED = "_x_purges_environment"

__all__ = ["clear_environment", "convert_dict_to_env_variables", "patch_environment", "purge_accelerate_environment"]

_log = logging.getLogger(__name__)
# What would break a ``KEY=value`` line of an environment file, or a shell reading it.
_FORBIDDEN = (";", "\n", "<", ">", " ")


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set each keyword (upper-cased) to ``str(value)`` in ``os.environ``; restore on exit.

    A variable that existed gets its old value back, one that did not is removed again.

    Examples:
        >>> with patch_environment(x_doc_example="1"):
        ...     os.environ["X_DOC_EXAMPLE"]
        '1'
        >>> "X_DOC_EXAMPLE" in os.environ
        False
    """
    existing: dict[str, str] = {}
    for key, value in kwargs.items():
        key = key.upper()
        if key in os.environ:
            existing[key] = os.environ[key]
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key in kwargs:
            key = key.upper()
            if key in existing:
                os.environ[key] = existing[key]
            else:
                os.environ.pop(key, None)


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Empty ``os.environ`` for the block; on exit it holds exactly what it held before.

    Examples:
        >>> os.environ["X_DOC_EXAMPLE"] = "kept"
        >>> with clear_environment():
        ...     len(os.environ)
        0
        >>> os.environ.pop("X_DOC_EXAMPLE")
        'kept'
    """
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()  # what the block added goes too
        os.environ.update(saved)


@contextlib.contextmanager
def _purged() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(_PREFIXES)]:
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]
        os.environ.update(before)  # and what the call removed comes back


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Undo the ``ACCELERATE_*`` (and x's ``X_*``) variables a function, or each ``test*`` method of a
    class and its subclasses, sets or changes, as Accelerate's decorator of that name does.

    Examples:
        >>> @purge_accelerate_environment
        ... def configure():
        ...     os.environ["ACCELERATE_MIXED_PRECISION"] = "fp16"
        >>> configure()
        >>> "ACCELERATE_MIXED_PRECISION" in os.environ
        False
    """

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _purged():
                return func(*args, **kwargs)

        setattr(wrapper, _WRAPPED, True)
        return wrapper

    if not isinstance(func_or_cls, type):
        return wrap(func_or_cls)  # type: ignore[arg-type,return-value]

    def wrap_tests(cls: type) -> None:
        for name in dir(cls):
            method = getattr(cls, name)
            if name.startswith("test") and callable(method) and not getattr(method, _WRAPPED, False):
                setattr(cls, name, wrap(method))

    wrap_tests(func_or_cls)
    previous = func_or_cls.__dict__.get("__init_subclass__")

    def init_subclass(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__get__(None, cls)(**kwargs)
        wrap_tests(cls)

    func_or_cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    return func_or_cls


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """``KEY=value\\n`` lines for an environment file; pairs that would break one are skipped with a warning.

    A pair is skipped when the key or the value is empty or holds ``;``, a newline, ``<``, ``>``
    or a space.

    Examples:
        >>> convert_dict_to_env_variables({"MY_FLAG": "1", "OMP_NUM_THREADS": "4"})
        ['MY_FLAG=1\\n', 'OMP_NUM_THREADS=4\\n']
    """
    lines: list[str] = []
    for key, value in current_env.items():
        key, value = str(key), str(value)
        if key and value and not any(char in key + value for char in _FORBIDDEN):
            lines.append(f"{key}={value}\n")
        else:
            _log.warning("skipping %s=%r: empty, or holds one of ; < > a space or a newline", key, value)
    return lines
