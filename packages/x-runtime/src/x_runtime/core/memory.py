"""Out-of-memory recovery: find the largest batch size that runs, and hand cached memory back.

``find_executable_batch_size`` keeps Accelerate's decorator contract (the wrapped function takes
the batch size as its first argument and the decorator supplies it) with two fixes: device caches
are emptied only after the failed attempt's exception, and with it the frames holding that
attempt's tensors, has been dropped; and the wrapper keeps the wrapped function's name, docstring
and a signature without ``batch_size``.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

import torch

__all__ = [
    "clear_device_cache",
    "find_executable_batch_size",
    "free_memory",
    "release_memory",
    "should_reduce_batch_size",
]

F = TypeVar("F", bound=Callable[..., Any])

# Substrings of the RuntimeError messages that mean "this batch does not fit". torch raises a plain
# RuntimeError (not OutOfMemoryError) for several of them, so the message is all there is to go on.
_OOM_MESSAGES = (
    " out of memory",  # CUDA, HIP and XPU allocators: "CUDA out of memory. Tried to allocate ..."
    "MPS backend out of memory",
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN rejects some too-large convolutions with this instead of an OOM
    "DefaultCPUAllocator: can't allocate memory",
    "PT_DEVMEM Allocation failed",  # Gaudi (HPU)
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return cached, unused accelerator memory to the device, for every backend in use.

    Args:
        garbage_collection: Run ``gc.collect()`` first, so tensors kept alive only by reference
            cycles are freed before the caches are emptied. Slow; use it between attempts, not per step.

    Examples:
        >>> clear_device_cache(garbage_collection=True)
    """
    if garbage_collection:
        gc.collect()
    # Each empty_cache below is a no-op when its backend was never initialised, so probing every
    # backend is cheap and never creates a device context as a side effect.
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        xpu.empty_cache()
    mps_backend = getattr(torch.backends, "mps", None)
    if mps_backend is not None and mps_backend.is_available():
        torch.mps.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop references to ``objects``, collect garbage and empty the device caches.

    The caller still holds its own names for the objects, so reassign them from the result
    (``a, b = release_memory(a, b)``); only then can the memory actually be freed.

    Args:
        *objects: Tensors, models, optimizers or anything else holding device memory.

    Returns:
        One ``None`` per object, to assign back to the caller's variables.

    Examples:
        >>> a, b = torch.ones(4), torch.ones(4)
        >>> a, b = release_memory(a, b)
        >>> a is None and b is None
        True
    """
    released: list[Any] = list(objects)
    del objects
    for index in range(len(released)):
        released[index] = None
    clear_device_cache(garbage_collection=True)
    return released


free_memory = release_memory  # the name Accelerate used before release_memory


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` means the batch did not fit in memory (so a smaller one may).

    Args:
        exception: The exception raised by a training or evaluation attempt.

    Returns:
        True for ``torch.OutOfMemoryError`` and for the ``RuntimeError`` messages CUDA, HIP, XPU,
        MPS, cuDNN, the CPU allocator and HPU use for allocation failures; False otherwise.

    Examples:
        >>> should_reduce_batch_size(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        True
        >>> should_reduce_batch_size(ValueError("CUDA out of memory"))
        False
    """
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exception, oom_type):
        return True
    if not isinstance(exception, RuntimeError):
        return False
    message = str(exception)
    return any(fragment in message for fragment in _OOM_MESSAGES)


def _shrink(batch_size: int) -> int:
    # Accelerate's step: 90% of the size that failed, so the size found is within 10% of the largest.
    return int(batch_size * 0.9)


@overload
def find_executable_batch_size(
    function: F, starting_batch_size: int = ..., reduce_batch_size_fn: Callable[..., int] | None = ...
) -> F: ...


@overload
def find_executable_batch_size(
    function: None = ..., starting_batch_size: int = ..., reduce_batch_size_fn: Callable[..., int] | None = ...
) -> Callable[[F], F]: ...


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> Any:
    """Run ``function`` with the largest batch size that does not run out of memory.

    ``function`` takes the batch size as its first parameter; the decorator supplies it, so callers
    pass only the remaining arguments. When an attempt fails with an out-of-memory error (see
    ``should_reduce_batch_size``) memory is released and ``function`` is called again with a smaller
    batch size. Any other exception propagates unchanged. The size that last worked is remembered,
    so a later call of the decorated function starts from it rather than from
    ``starting_batch_size`` (as in Accelerate).

    Args:
        function: The function to wrap; omit it to use the decorator with arguments.
        starting_batch_size: The first batch size tried.
        reduce_batch_size_fn: Returns the next batch size to try after an out-of-memory error; it
            receives the failed batch size (a zero-argument callable, as Accelerate accepts, is
            called with nothing). Default: 90% of the failed size, as Accelerate (``int(size * 0.9)``).

    Returns:
        The wrapped function, whose signature omits the batch size parameter.

    Raises:
        TypeError: (when called) the batch size was passed explicitly.
        RuntimeError: (when called) the batch size reached zero without a successful attempt (at once
            for a ``starting_batch_size`` of 0, as Accelerate).

    Examples:
        >>> @find_executable_batch_size(starting_batch_size=64)
        ... def train(batch_size, steps):
        ...     if batch_size > 16:
        ...         raise torch.OutOfMemoryError("CUDA out of memory.")
        ...     return batch_size * steps
        >>> train(10)
        160
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )

    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(
            f"`{function.__name__}` must take the batch size as its first positional parameter "
            "for find_executable_batch_size to pass it"
        )
    batch_name = parameters[0].name
    rest = parameters[1:]
    takes_varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in rest)
    max_positional = sum(
        p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in rest
    )
    next_size = _next_size_fn(reduce_batch_size_fn)
    batch_size = starting_batch_size

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        if batch_name in kwargs or (not takes_varargs and len(args) > max_positional):
            shown = ", ".join(f"{p.name}={value!r}" for p, value in zip(rest, args[1:], strict=False))
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called. "
                f"Remove it, the decorator already passes it: `{function.__name__}({shown})`"
            )
        clear_device_cache(garbage_collection=True)
        while True:
            if batch_size <= 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            # Outside the except block: the exception and its traceback, whose frames still
            # reference the failed attempt's tensors, are gone, so this can actually free them.
            clear_device_cache(garbage_collection=True)
            batch_size = int(next_size(batch_size))

    wrapper.__signature__ = signature.replace(parameters=rest)  # type: ignore[attr-defined]
    return wrapper


def _next_size_fn(reduce_batch_size_fn: Callable[..., int] | None) -> Callable[[int], int]:
    if reduce_batch_size_fn is None:
        return _shrink
    try:
        takes_nothing = not inspect.signature(reduce_batch_size_fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: assume they take the size
        takes_nothing = False
    if takes_nothing:
        return lambda _size: reduce_batch_size_fn()
    return reduce_batch_size_fn
