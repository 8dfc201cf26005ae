"""Running code on some processes only, in order, or on a share of the inputs.

Functions of a ``ProcessState``; the ``Accelerator`` exposes them as its methods under
Accelerate's names (``main_process_first``, ``on_main_process``, ``split_between_processes``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

import torch

from x_runtime.process.topology.state import ProcessState

__all__ = ["first_on", "on_process", "share_bounds", "split_between_processes"]

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def first_on(state: ProcessState, is_first: bool) -> Iterator[None]:
    """Processes where ``is_first`` run the block first, the others after them (barriers)."""
    if not is_first:
        state.wait_for_everyone()
    try:
        yield
    finally:
        if is_first:
            state.wait_for_everyone()


def on_process(state: ProcessState, predicate: Callable[[ProcessState], bool]) -> Callable[[F], F]:
    """Decorator: run the function where ``predicate(state)`` holds; elsewhere return None."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if predicate(state) else None

        return wrapper  # type: ignore[return-value]

    return decorate


def share_bounds(length: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``index`` when ``length`` items are dealt into ``parts`` runs.

    The first ``length % parts`` parts get one item more.

    Examples:
        >>> [share_bounds(5, 2, i) for i in range(2)]
        [(0, 3), (3, 5)]
    """
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _is_table(inputs: Any) -> bool:
    # datasets.Dataset (and look-alikes) without importing datasets: rows are taken with select().
    return callable(getattr(inputs, "select", None)) and hasattr(inputs, "column_names")


def _split(inputs: Any, parts: int, index: int, apply_padding: bool) -> Any:
    if isinstance(inputs, Mapping):
        lengths = {len(value) for value in inputs.values()}
        if len(lengths) > 1:
            raise ValueError(f"split_between_processes: dict values differ in length ({sorted(lengths)})")
        # Mapping declares no constructor; the concrete type (dict, OrderedDict, ...) is built from a dict.
        rebuild = cast("Callable[[dict[Any, Any]], Any]", type(inputs))
        return rebuild({k: _split(v, parts, index, apply_padding) for k, v in inputs.items()})
    length = len(inputs)
    start, stop = share_bounds(length, parts, index)
    longest = -(-length // parts)
    if _is_table(inputs):  # a datasets.Dataset: slicing would give a dict of columns
        rows = list(range(start, stop))
        if apply_padding and length and len(rows) < longest:
            rows += [rows[-1] if rows else length - 1] * (longest - len(rows))
        return inputs.select(rows)
    share = inputs[start:stop]
    if apply_padding and length and len(share) < longest:
        filler = share[-1:] if len(share) else inputs[length - 1 : length]
        missing = longest - len(share)
        if isinstance(share, torch.Tensor):
            share = torch.cat([share, *[filler] * missing])
        else:
            share = share + type(share)(filler) * missing
    return share


@contextlib.contextmanager
def split_between_processes(state: ProcessState, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
    """This process's contiguous share of a list, tuple, tensor, dict of those, or ``datasets.Dataset``.

    A ``Dataset`` share is a ``Dataset`` of this process's rows (``select``).

    With ``apply_padding`` every share has the same length, padded by repeating its own last
    item (the last input for an empty share), so the shares can be gathered.
    """
    if state.world_size == 1:
        yield inputs
        return
    yield _split(inputs, state.world_size, state.rank, apply_padding)
