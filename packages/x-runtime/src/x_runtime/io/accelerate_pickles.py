"""The pickles Accelerate's ``save_state`` writes: read without running pickled code, and written.

Accelerate writes ``random_states_<rank>.pkl`` with ``torch.save``: a dict of the step, Python's
``random`` state (a tuple), NumPy's (a tuple holding a ``uint32`` array), torch's ``ByteTensor``
states and, on XLA, an int. torch's safe loader (``weights_only=True``) already admits tensors,
numbers, strings, tuples, lists and dicts; the few NumPy names an array needs to be rebuilt are
admitted for this one read, and nothing else: a file naming any other callable (``os.system``
in a tampered file) is refused before it is called, with one line naming it.

x writes the same file beside its own ``random_states_<rank>.bin`` (``accelerate_random_states``):
a run x saved resumes under Accelerate's ``load_state`` with the same draws as under x's.
"""

from __future__ import annotations

import codecs
import contextlib
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["DEVICE_RNG_KEYS", "accelerate_random_states", "load_accelerate_pickle", "numpy_globals", "x_random_states"]

# torch names the refused callable in one of these phrasings (it varies across torch versions).
_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)")


def numpy_globals() -> list[Any]:
    """What rebuilds a NumPy array and its dtype (Accelerate's own ``TORCH_SAFE_GLOBALS``)."""
    # codecs.encode: protocol-2 pickles (torch.save's) write an array's bytes through it.
    import numpy  # an x-runtime dependency; imported only when such a file is read

    allowed: list[Any] = [codecs.encode]
    core = getattr(numpy, "_core", None) or numpy.core  # NumPy 2 renamed numpy.core
    allowed += [core.multiarray._reconstruct, numpy.ndarray, numpy.dtype]
    dtypes = getattr(numpy, "dtypes", None)  # NumPy >= 1.25 pickles a dtype through its class
    if dtypes is not None:
        allowed.append(dtypes.UInt32DType)
    return allowed


# x's generator names -> the keys Accelerate's load_state reads them from.
DEVICE_RNG_KEYS = {"cuda": "torch_cuda_manual_seed", "xpu": "torch_xpu_manual_seed", "xla": "xm_seed"}


def accelerate_random_states(rng: dict[str, Any], step: int) -> dict[str, Any]:
    """``rng`` (``capture_rng_state``'s dict) as Accelerate's ``save_state`` stores it, with its ``step``.

    NumPy's state goes back to the ``uint32`` array ``np.random.set_state`` takes; the other
    generators' states are the objects Accelerate itself stores.

    Examples:
        >>> import random
        >>> rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        >>> sorted(accelerate_random_states(rng, 3))
        ['random_state', 'step', 'torch_manual_seed']
    """
    states: dict[str, Any] = {"step": step, "random_state": rng["python"], "torch_manual_seed": rng["torch"]}
    if "numpy" in rng:
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        states["numpy_random_seed"] = (kind, keys.numpy().astype("uint32"), pos, has_gauss, cached)
    states.update({theirs: rng[ours] for ours, theirs in DEVICE_RNG_KEYS.items() if ours in rng})
    return states


def x_random_states(saved: dict[str, Any]) -> dict[str, Any]:
    """Accelerate's stored states (``load_accelerate_pickle``'s dict) as ``restore_rng_state`` takes them.

    Examples:
        >>> import random
        >>> rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        >>> back = x_random_states(accelerate_random_states(rng, 3))
        >>> back["python"] == rng["python"], bool(torch.equal(back["torch"], rng["torch"]))
        (True, True)
    """
    rng: dict[str, Any] = {"python": saved.get("random_state"), "torch": saved.get("torch_manual_seed")}
    numpy_state = saved.get("numpy_random_seed")
    if numpy_state is not None:
        kind, keys, pos, has_gauss, cached = numpy_state
        rng["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    rng.update({ours: saved[theirs] for ours, theirs in DEVICE_RNG_KEYS.items() if theirs in saved})
    return {k: v for k, v in rng.items() if v is not None}


@contextlib.contextmanager
def _admitted(extra: list[Any]) -> Iterator[None]:
    # torch's allowlist is process-wide; put back exactly what was there before.
    serialization: Any = torch.serialization
    if hasattr(serialization, "safe_globals"):  # torch >= 2.5
        with serialization.safe_globals(extra):
            yield
        return
    before = serialization.get_safe_globals()
    serialization.add_safe_globals(extra)
    try:
        yield
    finally:
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)


def load_accelerate_pickle(path: Path) -> Any:
    """Read one of Accelerate's ``torch.save`` pickles (RNG states) on CPU, running no pickled code.

    Raises:
        pickle.UnpicklingError: the file names a callable Accelerate never stores there; the
            message names the file and the callable, which was not called.

    Examples:
        >>> import random, tempfile
        >>> path = Path(tempfile.mkdtemp()) / "random_states_0.pkl"
        >>> torch.save({"step": 3, "random_state": random.getstate()}, path)
        >>> load_accelerate_pickle(path)["step"]
        3
    """
    try:
        with _admitted(numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        text = str(error)
        found = _GLOBAL.search(text)
        if found:
            what = f"a call to {found.group(1)}"
        else:  # e.g. a pickle torch.save never writes; torch's own reason, without its advice to run it
            detail = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
            what = f"pickled data torch's safe loader refuses ({detail[0] if detail else 'no detail'})"
        raise pickle.UnpicklingError(
            f"refused {path}: it holds {what}, which Accelerate never writes there (only tensors, NumPy arrays, "
            "numbers, tuples and dicts); nothing in it was run. Was the file replaced?"
        ) from None
