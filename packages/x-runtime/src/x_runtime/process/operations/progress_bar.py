"""``tqdm``: a progress bar shown by the main process only, as Accelerate's ``accelerate.utils.tqdm``."""

from __future__ import annotations

from typing import Any

from x_common.process_env import process_env

__all__ = ["tqdm"]


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every process but the main one (unless
    ``main_process_only=False``). Needs the ``tqdm`` package.

    Examples:
        >>> sum(tqdm(range(3)))
        3
    """
    if args and isinstance(args[0], bool):
        raise ValueError(
            "tqdm(True, ...) / tqdm(False, ...) is Accelerate's old call: pass main_process_only=True/False instead"
        )
    try:
        from tqdm.auto import tqdm as bar
    except ImportError:
        raise ImportError("accelerate.utils.tqdm needs the tqdm package: pip install tqdm") from None
    if main_process_only and process_env().local_rank != 0:
        kwargs["disable"] = True
    return bar(*args, **kwargs)
