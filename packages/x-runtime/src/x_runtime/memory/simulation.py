"""The plan for a running step: x-estimate's simulation of it, asked of a process beside the run.

``step_request`` describes the step the script runs (the model's transformers class and config,
the precision, the optimizer, checkpointing, attention) in x-estimate's terms, or says in one line
why it cannot be simulated. ``Simulations`` starts ``python -m x_estimate.simulate.serve`` once,
when the first step is asked for, and reads its answers on a thread of its own, so a request can
be sent at the start of step 1 and read when it is ready, without the loop waiting. The server
sees no GPU (``CUDA_VISIBLE_DEVICES`` empty): a CUDA step is simulated on fake tensors, and a
CUDA context in it would take the GPU memory the plan is about (the server hides the GPUs from
itself before torch loads).
"""

from __future__ import annotations

import atexit
import importlib.util
import itertools
import json
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar

import torch

__all__ = ["PlannedStep", "Simulations", "step_request", "x_estimate_installed"]

# x-estimate's names for the optimizers whose steps it simulates, by torch class.
_OPTIMIZERS = {"AdamW": "adamw", "Adam": "adamw", "SGD": "sgd"}


def x_estimate_installed() -> bool:
    return importlib.util.find_spec("x_estimate") is not None


@dataclass(frozen=True)
class PlannedStep:
    """x-estimate's figures for one step: the peak, its parts, what stays between steps."""

    peak: int
    parts: dict[str, int]
    steady: int
    reserved: int | None  # a CUDA step's caching-allocator segments; None on CPU


@dataclass(frozen=True)
class StepRequest:
    """What x-estimate needs to simulate the step; ``batch_size``/``seq_len`` are set per batch."""

    fields: dict[str, Any] = field(default_factory=dict)

    def at(self, batch_size: int, seq_len: int, **changes: Any) -> dict[str, Any]:
        return {**self.fields, "batch_size": batch_size, "seq_len": seq_len, **changes}


def _precision(mode: str, model: torch.nn.Module) -> str | None:
    if mode == "bf16":
        return "mixed-bf16"
    if mode == "fp16":
        return "mixed-fp16"
    if mode != "no":
        return None  # fp8: not simulated
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    dtype = torch.float32 if weight is None else weight.dtype
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype)


def _checkpointing(model: torch.nn.Module) -> bool:
    # transformers 5 renamed the property (the old name warns): ask the class which it has.
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def step_request(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, precision: str, device: torch.device
) -> StepRequest | str:
    """The step's description for x-estimate, or why it cannot be simulated (one line)."""
    name = type(model).__name__
    config: Any = getattr(model, "config", None)
    if not type(model).__module__.startswith("transformers") or not hasattr(config, "to_dict"):
        return f"x-estimate simulates transformers models by class and config; {name} is not one"
    optimizer_name = _OPTIMIZERS.get(type(optimizer).__name__)
    if optimizer_name == "sgd" and not optimizer.defaults.get("momentum"):
        optimizer_name = None  # x-estimate's SGD step keeps a momentum buffer
    if optimizer_name is None:
        return f"x-estimate simulates AdamW, Adam and SGD with momentum; this run steps {type(optimizer).__name__}"
    simulated = _precision(precision, model)
    if simulated is None:
        return f"x-estimate does not simulate the {precision} precision of this run"
    if device.type not in ("cpu", "cuda"):
        return f"x-estimate simulates CPU and CUDA steps; this run is on {device.type}"
    return StepRequest(
        {
            "model_class": name,
            "config": config.to_dict(),
            "precision": simulated,
            "optimizer": optimizer_name,
            "checkpointing": _checkpointing(model),
            "attn_implementation": getattr(config, "_attn_implementation", None),
            "device": device.type,
        }
    )


class Simulations:
    """A ``x_estimate.simulate.serve`` process, started on the first request and asked over a pipe.

    One per training process (``shared``): a test suite or a notebook builds many accelerators,
    and a server each would hold torch and transformers in memory many times over.
    """

    GONE = "x-estimate's simulation process"  # how the lines start that say it stopped answering
    _shared: ClassVar[Simulations | None] = None

    @classmethod
    def shared(cls) -> Simulations:
        """This process's server (started on the first request), closed at exit."""
        if cls._shared is None:
            cls._shared = cls()
            atexit.register(cls._shared.close)
        return cls._shared

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._ids = itertools.count(1)
        self._answers: dict[int, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        self._closed = False

    def _start(self) -> subprocess.Popen[str]:
        if self._process is None:
            # The server inherits the run's environment (its caches, its HF_HOME); it hides the GPUs itself.
            self._process = subprocess.Popen(
                [sys.executable, "-m", "x_estimate.simulate.serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            assert self._process.stdout is not None
            threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True, name="x-plan").start()
        return self._process

    def _read(self, answers: IO[str]) -> None:
        for line in answers:
            try:
                found = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._arrived:
                self._answers[int(found.get("id") or 0)] = found
                self._arrived.notify_all()
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()

    def submit(self, request: dict[str, Any]) -> int:
        """Send ``request``; its id, for ``ready`` and ``result``."""
        number = next(self._ids)
        process = self._start()
        assert process.stdin is not None
        try:
            process.stdin.write(json.dumps({"id": number, **request}, default=str) + "\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            with self._arrived:
                self._answers[number] = {"error": f"{self.GONE} ended"}
        return number

    def ready(self, number: int) -> bool:
        with self._arrived:
            return number in self._answers or self._closed

    def result(self, number: int, timeout: float | None = None) -> PlannedStep | str:
        """The answer to request ``number`` (waiting for it), or the one line that says why there is none."""
        with self._arrived:
            self._arrived.wait_for(lambda: number in self._answers or self._closed, timeout)
            found = self._answers.pop(number, None)
            ended = self._closed
        if found is None:
            return f"{self.GONE} {'ended without an answer' if ended else f'gave no answer in {timeout or 0:.0f} s'}"
        if found.get("error"):
            return str(found["error"])
        return PlannedStep(int(found["peak"]), dict(found["parts"]), int(found["steady"]), found.get("reserved"))

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
