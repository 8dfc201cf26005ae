"""Seeding and the random-number states a checkpoint must carry to resume bit for bit.

States are stored as tensors, ints and tuples only, so a checkpoint loads with
``torch.load(weights_only=True)`` and never runs pickled code.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["capture_rng_state", "keep_xla_rng", "restore_rng_state", "set_seed", "synchronize_rng_states"]


def _numpy() -> Any | None:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _xla_model() -> Any | None:
    # Only when the script already runs on XLA: importing torch_xla takes seconds.
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla.core.xla_model as xm

    return xm


@contextlib.contextmanager
def keep_xla_rng() -> Iterator[None]:
    """Leave the XLA generator as it was: every graph cut (a sync, a rendezvous) advances it, and a
    save or a barrier must not change which random numbers the run draws next."""
    xm = _xla_model()
    seed = xm.get_rng_state() if xm is not None else None
    try:
        yield
    finally:
        if xm is not None:
            xm.set_rng_state(seed)


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False, *, process_index: int = 0) -> int:
    """Seed Python's, NumPy's and torch's generators (every device); return the seed used.

    Args:
        seed: the seed.
        device_specific: add ``process_index`` so each process draws different numbers.
        deterministic: also ask torch for deterministic algorithms (slower; errors on ops
            that have none).

    Examples:
        >>> set_seed(0); a = torch.rand(1); set_seed(0); bool(torch.equal(a, torch.rand(1)))
        0
        True
    """
    if device_specific:
        seed += process_index
    random.seed(seed)
    numpy = _numpy()
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA/XPU/MPS device
    xm = _xla_model()
    if xm is not None:
        xm.set_rng_state(seed)  # the XLA generator is separate: manual_seed leaves it alone
    if deterministic:
        torch.use_deterministic_algorithms(True)
        if torch.backends.cudnn.is_available():
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
    return seed


def capture_rng_state() -> dict[str, Any]:
    """Every generator's state, in types ``torch.load(weights_only=True)`` accepts."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = _numpy()
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        state["xpu"] = xpu.get_rng_state_all()
    xm = _xla_model()
    if xm is not None:
        state["xla"] = int(xm.get_rng_state())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng_state`` returned (entries for absent devices are ignored)."""
    python = state.get("python")
    if python is not None:
        version, internal, gauss = python
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    numpy = _numpy()
    if numpy is not None and "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    xpu = getattr(torch, "xpu", None)
    if "xpu" in state and xpu is not None and xpu.is_available():
        xpu.set_rng_state_all(state["xpu"])
    xm = _xla_model()
    if "xla" in state and xm is not None:
        xm.set_rng_state(int(state["xla"]))


def _rng_get_set(kind: str, generator: torch.Generator | None) -> tuple[Any, Any]:
    if kind == "torch":
        return torch.get_rng_state, torch.set_rng_state
    if kind == "cuda":
        return torch.cuda.get_rng_state, torch.cuda.set_rng_state
    if kind == "xpu" and getattr(torch, "xpu", None) is not None:
        return torch.xpu.get_rng_state, torch.xpu.set_rng_state
    if kind == "xla":
        xm = _xla_model()
        if xm is None:
            raise ValueError("synchronize_rng_states: 'xla' needs torch_xla running")
        return (lambda: torch.tensor([xm.get_rng_state()], dtype=torch.int64)), (lambda t: xm.set_rng_state(int(t[0])))
    if kind == "generator":
        if generator is None:
            raise ValueError("synchronize_rng_states: 'generator' needs generator=")
        return generator.get_state, generator.set_state
    raise ValueError(
        f"synchronize_rng_states: unknown rng type {kind!r}; use 'torch', 'cuda', 'xpu', 'xla' or 'generator'"
    )


def synchronize_rng_states(rng_types: Any, generator: torch.Generator | None = None) -> None:
    """Give every process rank 0's state of each generator in ``rng_types`` (Accelerate's name).

    Args:
        rng_types: Names (or Accelerate ``RNGType`` members): ``"torch"``, ``"cuda"``, ``"xpu"``,
            ``"xla"``, ``"generator"``.
        generator: The generator that ``"generator"`` synchronizes.

    Every process of the default group must call it; nothing happens without
    ``torch.distributed`` or with one process.

    Examples:
        >>> synchronize_rng_states(["torch"])
    """
    import torch.distributed as dist

    kinds = [
        str(getattr(kind, "value", kind)).lower()
        for kind in ([rng_types] if isinstance(rng_types, str) else rng_types or [])
    ]
    accessors = [_rng_get_set(kind, generator) for kind in kinds]  # unknown kinds fail on every rank first
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    backend = dist.get_backend()
    for get, put in accessors:
        state = get()
        if backend == "nccl":
            wire = state.to(torch.device("cuda", torch.cuda.current_device()))
        elif backend == "xla":
            import torch_xla

            wire = state.to(torch_xla.device())
        else:
            wire = state.clone()
        dist.broadcast(wire, src=0)
        put(wire.cpu())
