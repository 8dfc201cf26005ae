"""Simulated steps on request, for a training process that wants its plan: one JSON line in, one out.

The runtime's memory guard (``x_runtime.memory``) starts ``python -m x_estimate.simulate.serve``
beside a training process and asks it for the step that process is about to run. A process of
its own, not a thread of the training one: a simulation holds the GIL for about half a second
per small model and sets process-wide state while it runs (transformers' verbosity, warning
filters, a patched packed-sequence check), none of which a real step may see.

Request (one line)::

    {"id": 1, "model_class": "LlamaForCausalLM", "config": {...config.to_dict()...},
     "precision": "fp32", "optimizer": "adamw", "batch_size": 8, "seq_len": 128,
     "checkpointing": false, "attn_implementation": "sdpa", "device": "cpu"}

``"free_outputs": true`` asks for the loop that drops its outputs before backward, as
transformers' Trainer does. Answer (one line): ``{"id": 1, "peak": bytes, "parts": {part: bytes
at the peak}, "steady": bytes, "reserved": bytes or null, "seconds": float}`` or ``{"id": 1,
"error": "one line"}``. The server keeps each model it built and each answer it gave, so asking twice costs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any, TextIO

__all__ = ["answer", "serve"]

_OPTIONS = (
    "precision",
    "optimizer",
    "batch_size",
    "seq_len",
    "checkpointing",
    "attn_implementation",
    "free_outputs",
    "device",
)


class _Server:
    def __init__(self) -> None:
        self.models: dict[str, Any] = {}
        self.answers: dict[str, dict[str, Any]] = {}

    def model(self, class_name: str, config: dict[str, Any]) -> Any:
        from x_estimate.model.skeleton import model_of_class

        key = json.dumps([class_name, config], sort_keys=True, default=str)
        if key not in self.models:
            self.models[key] = model_of_class(class_name, config)
        return self.models[key]

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        from x_estimate.model.errors import EstimateError
        from x_estimate.simulate.error import SimulationError
        from x_estimate.simulate.step import simulate_training

        key = json.dumps({k: v for k, v in request.items() if k != "id"}, sort_keys=True, default=str)
        if key in self.answers:
            return self.answers[key]
        start = time.perf_counter()
        try:
            model = self.model(request["model_class"], request["config"])
            options = {k: request[k] for k in _OPTIONS if k in request}
            step = simulate_training(model, model.config, **options)
        except (EstimateError, SimulationError) as exc:
            return {"error": str(exc)}
        except Exception as exc:  # a model the simulation cannot run: said, not fatal to the run
            return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
        peak, parts, steady = step.sharded({})
        reserved = step.device_reserved({})
        found = {
            "peak": int(peak),
            "parts": {k: int(v) for k, v in parts.items()},
            "steady": int(steady),
            "reserved": None if reserved is None else int(reserved),
            "seconds": round(time.perf_counter() - start, 3),
        }
        self.answers[key] = found
        return found


_SERVER = _Server()


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request (see the module's docstring), in this process."""
    return {"id": request.get("id"), **_SERVER.answer(request)}


def serve(requests: TextIO, answers: TextIO) -> None:
    """Answer each line of ``requests`` on ``answers`` until ``requests`` ends."""
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            result: dict[str, Any] = {"id": None, "error": f"not a JSON request: {exc}"}
        else:
            result = answer(request)
        answers.write(json.dumps(result) + "\n")
        answers.flush()


if __name__ == "__main__":
    # Fake CUDA tensors need no GPU, and a CUDA context here would take the memory the plan is about.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    # A guest beside a training run: on a machine whose cores the run keeps busy, the run goes first.
    with contextlib.suppress(OSError, AttributeError):
        os.nice(10)
    # What the libraries print, from Python or C, must not land in the answers: the protocol keeps
    # the pipe on a descriptor of its own, and descriptor 1 becomes stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, protocol)
