"""The memory guard: the run's real peak beside x-estimate's plan, and a warning before a batch runs out.

An OOM hours into a run is the usual way to learn a plan was wrong. The guard closes the loop:

1. At the first training forward it asks x-estimate (``simulation.py``, a process beside the run)
   for the step this run takes: the model's class and config, this batch's shape, the precision,
   the optimizer, checkpointing. The loop does not wait: step 1 runs meanwhile.
2. Step 1 creates the optimizer's state halfway through, so its peak is not the one every later
   step repeats. The guard measures the first step that starts after the plan arrived (step 2
   when the simulation is quicker than a step) from its first forward to its optimizer step
   (``measure.py``), and the main process prints one line::

       x: memory of step 2: peak 1.63 GiB allocated (RSS +1.41 GiB), planned 1.63 GiB (+0.0%, within x-estimate's 3%)

   Off by more than x-estimate's stated error (docs/estimate-accuracy.md: 3% on CPU, 2% of a
   GPU's allocated bytes, 14% under to 4% over its reserved ones), the line names the term that
   differs most (weights, optimizer state, activations, the allocator's overhead): the estimate or
   the script then has a bug to look at.
3. A later batch larger than any before (a longer sequence) is simulated before its forward runs;
   if its peak would not fit the device (or ``X_MEMORY_BUDGET``), the guard warns once with the
   batch's shape and the first of a halved batch (with twice the accumulation) or activation
   checkpointing that the simulation says fits. Each forward's planned peak goes to the one-line
   OOM message (``core/out_of_memory.py``).

After step 2 a forward costs the guard a shape comparison. It is on where x-estimate is installed;
``X_MEMORY_GUARD=0`` turns it off. Under FSDP the line is the measured figure only: the plan per
device under the shard is ``x-estimate --plan``'s, which this guard does not replay yet; the same
holds for models x-estimate cannot simulate (it says why). Under DeepSpeed (whose engine steps the
optimizer) and torch.compile the guard is off (``accelerator/memory.py``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from x_common import env
from x_common.host_memory import host_memory
from x_common.sizes import format_size
from x_runtime.core.nested import flatten_tensors
from x_runtime.core.out_of_memory import note_batch, note_planned_peak
from x_runtime.memory.measure import MeasuredPeak, StepMeasurement, storage_bytes
from x_runtime.memory.simulation import PlannedStep, Simulations, StepRequest, step_request

__all__ = ["GuardOptions", "MemoryGuard", "batch_shape"]

# x-estimate's stated error (docs/estimate-accuracy.md): (how far over, how far under) the
# plan may be, as a share of the measured figure.
_CPU_ERROR = (0.03, 0.03)
_CUDA_ALLOCATED_ERROR = (0.02, 0.02)
_CUDA_RESERVED_ERROR = (0.04, 0.14)
_WAIT_FOR_PROJECTION = 120.0  # seconds; a simulation of a large model takes a few


@dataclass(frozen=True)
class GuardOptions:
    device: torch.device
    precision: str  # the accelerator's mixed precision: no, bf16, fp16, fp8
    is_main: bool  # prints the step's line
    compare: bool  # False under sharded strategies: the measured line only
    budget: int | None = None  # bytes the guard plans against instead of the device's memory
    accumulation: int = 1
    ddp_buckets: bool = False  # DDP keeps gradient buckets beside the gradients (no gradient_as_bucket_view)


def _size(nbytes: float) -> str:
    return format_size(nbytes, precision=2)


def batch_shape(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(batch size, sequence length) of a forward's main input; images count as length 1."""
    main = getattr(module, "main_input_name", "input_ids")
    found = kwargs.get(main)
    if found is None:
        found = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if not isinstance(found, torch.Tensor) or found.dim() == 0:
        return None
    if found.is_floating_point():  # pixel values: the size comes from the config
        return int(found.shape[0]), 1
    return int(found.shape[0]), int(found.shape[1]) if found.dim() > 1 else 1


def _percent(measured: int, planned: int) -> float:
    # Rounded to the line's digit, and -0.0 made 0.0: "+0.0%" for an exact plan, never "-0.0%".
    return round((planned - measured) / measured, 3) + 0.0 if measured else 0.0


def _no_guard() -> None:
    return None


def _ignore(*args: Any, **kwargs: Any) -> None:
    """A copied model's or optimizer's guard hook: the guard stayed with the original."""


class _Hook:
    """One of the guard's hooks; a copy of what it hangs on (pickle, deepcopy) gets ``_ignore``."""

    def __init__(self, call: Callable[..., None]) -> None:
        self.call = call

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if torch.compiler.is_compiling():
            return  # traced into a compiled graph (a model compiled after prepare): the guard stays out of it
        self.call(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_inert_hook, ())


def _inert_hook() -> Callable[..., None]:
    return _ignore


class MemoryGuard:
    """Watches one model and its optimizer; see the module's docstring for what it does when."""

    def __init__(self, options: GuardOptions, *, say: Callable[[str], None] | None = None) -> None:
        self.options = options
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._simulations = Simulations.shared()
        self._request: StepRequest | None = None
        self._why_no_plan: str | None = None
        self._first: int | None = None  # the first step's simulation request
        self._dropping: int | None = None  # the measured step, simulated for a loop that drops its outputs
        self._plan: PlannedStep | str | None = None
        self._stage = "new"  # new -> first (step 1 runs) -> waiting -> measuring -> watching
        self._steps = 0
        self._forwards = 0  # training forwards seen
        self._micro_batches = options.accumulation  # forwards per optimizer step, counted in step 1
        self._after_step = False
        self._simulated: list[tuple[int, int]] = []  # batch shapes simulated for the projection
        self._window: tuple[int, int] | None = None  # the measured step's batch
        self._first_shape: tuple[int, int] | None = None  # the batch of the first simulation asked for
        self._known: dict[tuple[int, int], PlannedStep] = {}  # plans by batch shape, for the OOM line
        self._warned = False
        self._measurement: StepMeasurement | None = None
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._handles: list[Any] = []
        self.report: tuple[MeasuredPeak, PlannedStep | str] | None = None  # what the step's line said

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy of the accelerator (pickle, deepcopy) carries no guard: the hooks, the measurement
        # and the simulation process belong to the objects this one watches.
        return (_no_guard, ())

    def watch(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Start watching: hooks on ``model``'s forward and ``optimizer``'s step."""
        self._model, self._optimizer = model, optimizer
        found = step_request(model, optimizer, precision=self.options.precision, device=self.options.device)
        if isinstance(found, str):
            self._why_no_plan = found
        elif not self.options.compare:
            self._why_no_plan = "sharded runs get the measured figure only (their plan is x-estimate --plan's)"
        else:
            self._request = found
        self._handles = [
            model.register_forward_pre_hook(_Hook(self._before_forward), with_kwargs=True),
            optimizer.register_step_post_hook(_Hook(self._after_optimizer_step)),
        ]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        note_planned_peak(None)  # the OOM line names no plan this guard no longer follows
        if self._measurement is not None:
            self._measurement.cancel()
            self._measurement = None

    # -- hooks -------------------------------------------------------------------------------

    def _before_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self._never_failing_the_run():
            self._forward_starts(module, args, kwargs)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with self._never_failing_the_run():
            self._step_ended()

    @contextlib.contextmanager
    def _never_failing_the_run(self) -> Iterator[None]:
        # The guard watches the run; a fault of its own (a model it misreads) stops it, never the run.
        try:
            yield
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.close()
            if self.options.is_main:
                self._say(f"x: the memory guard stopped: {type(exc).__name__}: {' '.join(str(exc).split())}")

    def _forward_starts(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training or not torch.is_grad_enabled():
            note_planned_peak(None)  # evaluation forwards are not the training step planned
            return
        self._forwards += 1
        shape = batch_shape(module, args, kwargs)
        note_batch(kwargs or args, self.options.accumulation)  # the OOM line's batch, loader or not
        starts_step, self._after_step = self._after_step, False
        known = self._known.get(shape) if shape is not None else None
        note_planned_peak(None if known is None else known.reserved or known.peak)
        if self._stage == "new":
            self._stage = "first"
            if shape is not None and self._request is not None:
                self._first = self._simulations.submit(self._request.at(*shape))
                self._first_shape = shape
                self._simulated.append(shape)
            elif shape is None and self._why_no_plan is None:
                self._why_no_plan = f"no batch shape in {type(module).__name__}'s forward arguments"
            return
        if self._stage == "waiting" and starts_step and self._plan_ready():
            self._window = shape
            if shape is not None and self._request is not None and shape != self._first_shape:
                self._plan = self._planned(shape)  # the plan for the batch measured, not the first one
            if shape is not None and self._request is not None:
                # The loop may drop its outputs before backward (transformers' Trainer does): that
                # step is simulated too, and the line compares with the plan of the loop that ran.
                self._dropping = self._simulations.submit(self._request.at(*shape, free_outputs=True))
            measurement = StepMeasurement(self.options.device)
            alive = [*self._state_tensors(), *flatten_tensors(args), *flatten_tensors(kwargs)]
            if measurement.start(alive):  # else another profiler runs: a later step is measured
                self._measurement, self._stage = measurement, "measuring"
        elif (
            self._stage == "measuring"
            and shape is not None
            and self._window is not None
            and self._request is not None
            and shape[0] * shape[1] > self._window[0] * self._window[1]
        ):
            # Accumulation: another micro-batch of the measured step; its largest is the one planned.
            self._window = shape
            self._plan = self._planned(shape)
            self._dropping = self._simulations.submit(self._request.at(*shape, free_outputs=True))
        if shape is not None and self._request is not None:
            # A batch larger than any simulated is worth waiting for: its warning must come first.
            self._check(shape)

    def _step_ended(self) -> None:
        self._steps += 1
        self._after_step = True
        if self._steps == 1:
            # Forwards per optimizer step: accumulation, also when the loop accumulates by hand.
            self._micro_batches = max(1, self._forwards, self.options.accumulation)
        if self._stage == "first":
            self._stage = "waiting"
        elif self._stage == "measuring" and self._measurement is not None:
            measured = self._measurement.stop()
            self._measurement = None
            self._stage = "watching"
            self._report(measured)
            if self._request is None:
                self.close()  # nothing to project: no hook stays

    def yield_profiler(self) -> None:
        """Another profiler is about to start (``Accelerator.profile``): a measurement under way is dropped."""
        if self._stage == "measuring" and self._measurement is not None and self.options.device.type != "cuda":
            self._measurement.cancel()
            self._measurement, self._stage = None, "waiting"

    # -- the plan ----------------------------------------------------------------------------

    def _plan_ready(self) -> bool:
        if self._first is None:
            return True  # nothing asked: the measured line alone
        if not self._simulations.ready(self._first):
            return False
        self._plan = self._as_run(self._simulations.result(self._first, timeout=0), None)
        if isinstance(self._plan, PlannedStep) and self._first_shape is not None:
            self._known[self._first_shape] = self._plan
        elif isinstance(self._plan, str):
            self._request = None  # the model cannot be simulated: no projection either
        return True

    def _planned(self, shape: tuple[int, int], accumulation: int | None = None, **changes: Any) -> PlannedStep | str:
        assert self._request is not None
        number = self._simulations.submit(self._request.at(*shape, **changes))
        found = self._simulations.result(number, timeout=_WAIT_FOR_PROJECTION)
        if isinstance(found, str) and found.startswith(Simulations.GONE):
            self._request = None  # no answers to wait for again: the loop goes on unprojected
        return self._as_run(found, accumulation)

    def _as_run(self, plan: PlannedStep | str, accumulation: int | None) -> PlannedStep | str:
        """x-estimate's step, with what this run holds beside it.

        x-estimate simulates a step that starts without gradients; under accumulation every
        micro-batch after the first starts with all of them and keeps them through its peak. DDP
        without ``gradient_as_bucket_view`` keeps its buckets, a copy of the gradients, from the
        wrap on: a GPU's allocator counts them (on CPU they predate the step measured, and are in
        neither figure).
        """
        steps = self._micro_batches if accumulation is None else accumulation
        if isinstance(plan, str) or self._model is None:
            return plan
        gradients = sum(p.numel() * p.element_size() for p in self._model.parameters() if p.requires_grad)
        buckets = gradients if self.options.ddp_buckets and self.options.device.type == "cuda" else 0
        extra, parts = buckets, dict(plan.parts)
        if steps > 1:
            extra += gradients - plan.parts.get("gradients", 0)
            parts["gradients"] = gradients
        parts["gradients"] = parts.get("gradients", 0) + buckets
        if not extra:
            return plan
        reserved = None if plan.reserved is None else plan.reserved + extra
        return PlannedStep(plan.peak + extra, parts, plan.steady + buckets, reserved)

    def _state_tensors(self) -> list[Any]:
        assert self._model is not None and self._optimizer is not None
        model = self._model
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        state = [v for s in self._optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return [*model.parameters(), *model.buffers(), *grads, *state]

    # -- the step's line ---------------------------------------------------------------------

    def _report(self, measured: MeasuredPeak) -> None:
        plan: PlannedStep | str = self._plan if self._plan is not None else (self._why_no_plan or "no plan")
        loop = ""
        if isinstance(plan, PlannedStep) and self._dropping is not None:
            dropping = self._as_run(self._simulations.result(self._dropping, _WAIT_FOR_PROJECTION), None)
            if isinstance(dropping, PlannedStep) and abs(dropping.peak - measured.allocated) < abs(
                plan.peak - measured.allocated
            ):
                plan, loop = dropping, " for a loop that drops its outputs before backward"
        self.report = (measured, plan)
        if not self.options.is_main:
            return
        figures = f"peak {_size(measured.allocated)} allocated"
        if measured.reserved is not None:
            figures = f"peak {_size(measured.reserved)} reserved, {_size(measured.allocated)} allocated"
        elif measured.resident is not None:
            figures += f" (process resident {_size(measured.resident)})"
        line = f"x: memory of step {self._steps}: {figures}"
        if isinstance(plan, str):
            self._say(f"{line}; not planned: {plan}")
            return
        self._say(f"{line}, {self._comparison(measured, plan, loop)}")

    def _comparison(self, measured: MeasuredPeak, plan: PlannedStep, loop: str = "") -> str:
        if measured.reserved is not None and plan.reserved is not None:
            checks = [
                ("reserved", measured.reserved, plan.reserved, _CUDA_RESERVED_ERROR),
                ("allocated", measured.allocated, plan.peak, _CUDA_ALLOCATED_ERROR),
            ]
        else:
            error = _CUDA_ALLOCATED_ERROR if measured.reserved is not None else _CPU_ERROR
            checks = [("allocated", measured.allocated, plan.peak, error)]
        said, off = [], False
        for name, real, planned, (over, under) in checks:
            share = _percent(real, planned)
            said.append(f"{_size(planned)}{' ' + name if len(checks) > 1 else ''} ({share:+.1%})")
            off = off or share > over or share < -under
        stated = f"x-estimate's {_CPU_ERROR[0]:.0%}" if measured.reserved is None else "x-estimate's stated error"
        text = "planned " + ", ".join(said) + loop
        if not off:
            return f"{text}, within {stated}"
        return f"{text}; over {stated}: {self._differs(measured, plan)}"

    def _differs(self, measured: MeasuredPeak, plan: PlannedStep) -> str:
        """The term of the peak that differs most between the run and the plan."""
        assert self._model is not None and self._optimizer is not None
        weights = storage_bytes([*self._model.parameters(), *self._model.buffers()])
        state = storage_bytes(v for s in self._optimizer.state.values() for v in s.values())
        planned_state = plan.parts.get("optimizer_state", 0)
        planned_weights = plan.parts.get("weights", 0)
        terms = [
            ("weights", weights, planned_weights, "the model's dtype or tied weights"),
            ("optimizer state", state, planned_state, "the optimizer or its settings"),
            (
                "activations",
                measured.allocated - weights - state,
                plan.peak - planned_weights - planned_state,
                "the loss, attention, checkpointing, or a loop that keeps more alive",
            ),
        ]
        if measured.reserved is not None and plan.reserved is not None:
            terms.append(
                (
                    "allocator overhead",
                    measured.reserved - measured.allocated,
                    plan.reserved - plan.peak,
                    "fragmentation",
                )
            )
        name, real, planned, look = max(terms, key=lambda t: abs(t[1] - t[2]))
        return f"the {name} differ most (measured {_size(real)}, planned {_size(planned)}; look at {look})"

    # -- before a larger batch ---------------------------------------------------------------

    def _check(self, shape: tuple[int, int]) -> None:
        # A batch no larger in both dimensions than one already simulated needs no simulation.
        if any(shape[0] <= b and shape[1] <= s for b, s in self._simulated):
            return
        self._simulated.append(shape)
        plan = self._planned(shape)
        if isinstance(plan, str):
            return
        self._known[shape] = plan
        note_planned_peak(plan.reserved or plan.peak)
        room = self._room(plan)
        if room is None or self._fits(plan, room) or self._warned:
            return
        self._warned = True
        advice = self._fitting_setting(shape, room)
        figure = plan.reserved or plan.peak
        limit = (
            f"the {_size(room)} {env.MEMORY_BUDGET.name} allows"
            if self.options.budget is not None
            else f"the {_size(room)} this {self.options.device.type} device has for it"
        )
        self._say(
            f"x: warning: a batch of {shape[0]} x {shape[1]} is planned to peak at {_size(figure)}, over {limit}; {advice}"
        )

    def _room(self, plan: PlannedStep) -> int | None:
        """Bytes the step's peak may reach here, for a plan compared by ``_fits``."""
        if self.options.budget is not None:
            return self.options.budget
        device = self.options.device
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            others = total - free - torch.cuda.memory_reserved(device)  # the context, other processes
            return int(total - others)
        available = host_memory().available  # MemAvailable, under the cgroup limit where there is one
        # What the process holds now (weights, state) stays: the step's growth must fit what is free.
        return None if available is None else available + plan.steady

    def _fits(self, plan: PlannedStep, room: int) -> bool:
        return (plan.reserved or plan.peak) <= room

    def _fitting_setting(self, shape: tuple[int, int], room: int) -> str:
        batch, seq = shape
        steps = self._micro_batches
        micro = batch // 2
        while micro >= 1 and batch % micro == 0:
            plan = self._planned((micro, seq), accumulation=steps * batch // micro)
            if isinstance(plan, PlannedStep) and self._fits(plan, room):
                return (
                    f"a batch of {micro} with gradient_accumulation_steps={steps * batch // micro} "
                    f"fits (planned {_size(plan.reserved or plan.peak)}, the same examples per optimizer step)"
                )
            micro //= 2
        plan = self._planned(shape, checkpointing=True)
        if isinstance(plan, PlannedStep) and self._fits(plan, room):
            return f"activation checkpointing fits (planned {_size(plan.reserved or plan.peak)})"
        return (
            "no smaller batch nor activation checkpointing fits: see `x-estimate MODEL --plan` for sharding and offload"
        )
