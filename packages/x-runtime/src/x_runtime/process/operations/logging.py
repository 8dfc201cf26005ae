"""A logger that knows which process it runs in: log once for the job, or on every rank, or rank by rank.

Unlike Accelerate's ``get_logger`` this needs no ``Accelerator`` or state object first: the rank
comes from the launcher's environment (``x_common.process_env``) when a message is logged, and
from ``torch.distributed`` once a process group exists. It never changes the root logger's level,
and ``warning_once`` remembers messages per adapter instead of in a process-wide cache.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import torch.distributed as dist

from x_common.process_env import process_env
from x_runtime.process.collectives import barrier

__all__ = ["MultiProcessAdapter", "get_logger"]


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    place = process_env()
    return place.rank, place.world_size


class MultiProcessAdapter(logging.LoggerAdapter):
    """A ``LoggerAdapter`` whose methods take ``main_process_only`` and ``in_order`` keywords.

    ``main_process_only=True`` (the default) logs on global rank 0 only; ``False`` logs on every
    rank. ``in_order=True`` logs on every rank, one rank after another (with a barrier between
    ranks when ``torch.distributed`` is initialised), and overrides ``main_process_only``. In a job
    of more than one process each message is prefixed with ``[RANK n]``.
    """

    def __init__(self, logger: logging.Logger, extra: MutableMapping[str, object] | None = None):
        super().__init__(logger, extra or {})
        self._warned: set[tuple[str, str]] = set()

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at ``level`` on the processes chosen by ``main_process_only`` and ``in_order``.

        Args:
            level: A ``logging`` level such as ``logging.INFO``.
            msg: The message, %-formatted with ``args`` as in ``logging``.
            *args: Arguments for ``msg``.
            **kwargs: ``main_process_only`` (default True), ``in_order`` (default False), and the
                keywords ``logging.Logger.log`` accepts.

        Examples:
            >>> logger = get_logger("example")
            >>> logger.log(logging.INFO, "loaded %d shards", 4, main_process_only=False)
        """
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        # Logger.log counts stacklevel from its caller: _log_in_order when in order, else this method.
        # Unset, it skips this method so records name our caller's file and line; set, it counts
        # from this method, as Accelerate's does (a wrapper of this adapter sets it past its own frames).
        kwargs["stacklevel"] = kwargs.get("stacklevel", 2) + bool(in_order)
        if in_order:
            self._log_in_order(level, msg, args, kwargs)
            return
        if not self.isEnabledFor(level):
            return
        rank, world = _rank_and_world()
        if main_process_only and rank != 0:
            return
        msg, processed = self.process(self._prefix(msg, rank, world), kwargs)
        self.logger.log(level, msg, *args, **processed)

    def _log_in_order(self, level: int, msg: Any, args: tuple[Any, ...], kwargs: MutableMapping[str, Any]) -> None:
        rank, world = _rank_and_world()
        synchronize = dist.is_available() and dist.is_initialized()
        enabled = self.isEnabledFor(level)
        msg, kwargs = self.process(self._prefix(msg, rank, world), kwargs)
        # Every rank enters every barrier, even where this level is disabled, so ranks configured
        # with different levels cannot leave the others waiting.
        for turn in range(world if synchronize else 1):
            if enabled and (turn == rank or not synchronize):
                self.logger.log(level, msg, *args, **kwargs)
            if synchronize:
                barrier()

    @staticmethod
    def _prefix(msg: Any, rank: int, world: int) -> Any:
        return f"[RANK {rank}] {msg}" if world > 1 else msg

    def warning_once(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Like ``warning``, but a given message (with its arguments) is logged once per adapter.

        Examples:
            >>> logger = get_logger("example")
            >>> for _ in range(3):
            ...     logger.warning_once("deprecated option %s", "foo")
        """
        key = (str(msg), repr(args))
        if key in self._warned:
            return
        self._warned.add(key)
        # Counted from log(): log, this method, then our caller.
        kwargs.setdefault("stacklevel", 3)
        self.log(logging.WARNING, msg, *args, **kwargs)


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """Return a ``MultiProcessAdapter`` over ``logging.getLogger(name)``.

    Args:
        name: The logger name, usually ``__name__``.
        log_level: Level set on that named logger (e.g. ``"DEBUG"`` or ``logging.DEBUG``); None
            leaves its level unchanged. The root logger is never touched.

    Returns:
        An adapter whose calls log on the main process only unless told otherwise.

    Examples:
        >>> logger = get_logger(__name__, log_level="INFO")
        >>> logger.info("starting")  # main process only
        >>> logger.info("shard ready", main_process_only=False)  # every process
        >>> logger.info("my rank's view", in_order=True)  # every process, rank by rank
    """
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper() if isinstance(log_level, str) else log_level)
    return MultiProcessAdapter(logger, {})
