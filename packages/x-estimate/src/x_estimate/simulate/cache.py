"""Simulated steps kept on disk next to the summaries, so a repeat estimate needs no torch.

The key is the summary's key (config content, library versions, x-estimate's version) plus
every option the step depends on: precisions, optimizer, batch, sequence, checkpointing,
attention and the sharding the per-device figures were replayed with. Entries live in the
``simulations`` folder of the summary cache; a cache that cannot be read or written is skipped.
A ``--device cpu`` step's convolution buffers follow the CPU it was simulated on
(``simulate/convolutions.py``); the cache lives on that machine, and its key does not name the CPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from x_estimate.model.cache import cache_dir
from x_estimate.simulate.rows import Simulations
from x_estimate.training.peak import shard_divisors

__all__ = ["CachedStep", "load_simulations", "save_simulations", "simulation_key"]

FORMAT = 5  # 2: outputs alive through backward unless free_outputs; 3: device; 4: reserved per device when sharded;
# 5: convolutions hold their kernels' buffers (issue 48)


@dataclass(frozen=True)
class CachedStep:
    """What the report reads from a simulated step, for the sharding it was stored with."""

    peak: int
    at_peak: dict[str, int]
    steady: int
    phase: str
    activation_peak: int
    sharded_figures: list[Any]  # [peak, parts, steady] under the key's sharding, before extra weights
    notes: list[str] = field(default_factory=list)
    reserved: int | None = None
    sharded_reserved: int | None = None  # reserved on one device under the key's sharding, with its gathered unit

    def sharded(self, divisors: dict[str, int], extra_weights: int = 0) -> tuple[int, dict[str, int], int]:
        peak, parts, steady = self.sharded_figures
        return peak + extra_weights, {**parts, "weights": parts["weights"] + extra_weights}, steady + extra_weights

    def device_reserved(self, divisors: dict[str, int], extra_weights: int = 0) -> int | None:
        return self.sharded_reserved


def _path(key: str) -> Path:
    return cache_dir() / "simulations" / f"{key}.json"


def simulation_key(summary_key: str, options: Any, precisions: list[str]) -> str:
    material = {
        "format": FORMAT,
        "summary": summary_key,
        "precisions": precisions,
        **{
            k: getattr(options, k)
            for k in (
                "optimizer",
                "batch_size",
                "seq_len",
                "activation_checkpointing",
                "attn_implementation",
                "free_outputs",
                "device",
            )
        },
        "divisors": shard_divisors(options.shard, options.num_gpus),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def load_simulations(key: str) -> Simulations | None:
    try:
        data = json.loads(_path(key).read_text())
        steps = {p: CachedStep(**s) for p, s in data["steps"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Simulations(steps=steps)


def save_simulations(key: str, simulations: Simulations, options: Any) -> None:
    divisors = shard_divisors(options.shard, options.num_gpus)
    steps = {}
    for precision, step in simulations.steps.items():
        steps[precision] = {
            "peak": step.peak,
            "at_peak": step.at_peak,
            "steady": step.steady,
            "phase": step.phase,
            "activation_peak": step.activation_peak,
            "sharded_figures": list(step.sharded(divisors)),
            "notes": list(step.notes),
            "reserved": getattr(step, "reserved", None),
            "sharded_reserved": step.device_reserved(divisors) if divisors else getattr(step, "reserved", None),
        }
    path = _path(key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"steps": steps}, handle)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
