"""Training memory by running the step: the model's own class, on fake tensors, under a ledger.

A real training step (forward, loss, backward, optimizer step, ``zero_grad``) of the actual
model runs inside ``FakeTensorMode``: every tensor has its shape, dtype and device and no data,
so no op computes anything, and a 70B model runs on a laptop. A ``Ledger`` counts each storage
the ops allocate and free. Before it, an optimizer step on zero gradients creates the optimizer
state, as a first step would: the step measured is then any later step of training, where the
state exists during forward and backward, which is when a long run peaks. (Priming costs a
fraction of a full first step's ops.)

The peak is broken down by what each live storage is: weights (parameters and buffers),
gradients (``.grad`` of a parameter), optimizer state (in ``optimizer.state``), logits (a
tensor whose last dimension is the vocabulary: the logits, their float copy in the loss, their
gradient), activations (other tensors the forward allocated, kept for backward) and temporaries
(the rest: backward's and the optimizer step's intermediates).

With ``device="cpu"`` (the default) the kernels are the ones the CPU picks (SDPA's CPU flash
kernel, AdamW's per-tensor loop). ``device="cuda"`` simulates the step a GPU runs
(``cuda/step.py``): CUDA's attention and dropout kernels, AdamW's multi-tensor path, cuBLAS
workspaces, 512-byte blocks, and the caching allocator's reserved segments. Either way each
convolution also holds the buffers its kernels allocate beyond their outputs
(``convolutions.py``: oneDNN's layouts on the CPU it runs on, the copies around cuDNN).

The step's figures are a ``SimulatedStep``: its peak, its breakdown, and its replay for one
device; ``layer_extrapolation.py`` answers the same questions for a deep stack from two (or
three) of them. ``sharded`` and ``device_reserved`` replay the step as one device holds it when
parts of it are divided over several (ZeRO, FSDP) or moved to the CPU (offload).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from x_estimate.cuda.step import device_reserved
from x_estimate.simulate.convolutions import (
    ConvolutionBuffers,
    ConvolutionKernels,
    CpuTarget,
    CudnnConvolutions,
    OneDnnConvolutions,
)
from x_estimate.simulate.error import SimulationError
from x_estimate.simulate.fake_kernels import FakeKernels
from x_estimate.simulate.inputs import StepInputs, step_inputs
from x_estimate.simulate.ledger import Allocation, Ledger

__all__ = ["PARTS", "SimulatedStep", "SimulationError", "simulate_training"]

PARTS = ("weights", "gradients", "optimizer_state", "activations", "logits", "temporaries")


@dataclass(frozen=True)
class SimulatedStep:
    """Peak and steady-state bytes of a simulated training step, on one device."""

    peak: int
    at_peak: dict[str, int]  # PARTS -> bytes live at the peak
    steady: int  # live after optimizer.step() and zero_grad(): weights, buffers, optimizer state
    phase: str  # what the step was doing at the peak: forward, backward, optimizer
    notes: list[str] = field(default_factory=list)
    curve: list[tuple[int, int, str]] = field(default_factory=list, repr=False)  # (PARTS index, +/- bytes, phase)
    reserved: int | None = None  # device="cuda": the caching allocator's segments after a second step
    events: list[Any] | None = field(default=None, repr=False)  # device="cuda": cuda.step.Event, in order

    @property
    def activation_peak(self) -> int:
        """The most activation and logits bytes live at any moment (at the peak they may be gone)."""
        acts, logits = PARTS.index("activations"), PARTS.index("logits")
        live = best = 0
        for index, delta, _ in self.curve:
            if index in (acts, logits):
                live += delta
                best = max(best, live)
        return best

    def sharded(
        self, divisors: dict[str, int], extra_weights: int = 0, skip_phases: Collection[str] = ()
    ) -> tuple[int, dict[str, int], int]:
        """(peak, breakdown at that peak, steady state) with some parts divided, ZeRO-style.

        The whole step is replayed with ``divisors`` applied, so the peak may move (from the
        optimizer step to the start of backward, say) as it would on each device.
        ``extra_weights``: bytes every moment also holds (a gathered ZeRO-3 unit);
        ``skip_phases``: phases that run elsewhere (an offloaded optimizer step), not peaks here.
        """
        maxima, steady = self.phase_maxima(divisors)
        maxima = {phase: m for phase, m in maxima.items() if phase not in skip_phases}
        best = max(maxima.values(), key=lambda m: m[0], default=(0, dict.fromkeys(PARTS, 0)))
        parts = dict(best[1])
        parts["weights"] += extra_weights
        return best[0] + extra_weights, parts, steady + extra_weights

    def device_reserved(
        self, divisors: dict[str, int], extra_weights: int = 0, skip_phases: Collection[str] = ()
    ) -> int | None:
        """A CUDA step's reserved bytes on one device under ``sharded``'s arguments; None on CPU."""
        if self.events is None:
            return None
        divided = [divisors.get(p, 1) for p in PARTS]
        return device_reserved(
            self.events, divided, skip_phases, extra_weights, (_TEMPS, PARTS.index("optimizer_state"))
        )

    def phase_maxima(self, divisors: dict[str, int]) -> tuple[dict[str, tuple[int, dict[str, int]]], int]:
        """The largest moment of each phase, {phase: (bytes, breakdown)}, and the steady state.

        A divisor of 0 takes the part off the device (offloaded to the CPU). The optimizer
        step's temporaries are divided as its state is: a sharded optimizer steps its shard.
        """
        # One more bucket: the optimizer step's temporaries, folded into "temporaries" at the end.
        div = [divisors.get(part, 1) for part in PARTS] + [divisors.get("optimizer_state", 1)]
        live = [0] * len(div)
        maxima: dict[str, tuple[int, list[int]]] = {}
        for index, delta, phase in self.curve:
            live[_OPTIMIZER_TEMPS if index == _TEMPS and phase == "optimizer" else index] += delta
            if delta > 0:
                total = sum(_share(v, d) for v, d in zip(live, div, strict=True))
                if total > maxima.get(phase, (-1, None))[0]:
                    maxima[phase] = (total, list(live))
        out = {phase: (total, _breakdown(at, div)) for phase, (total, at) in maxima.items()}
        return out, sum(_share(v, d) for v, d in zip(live, div, strict=True))


_TEMPS = PARTS.index("temporaries")
_OPTIMIZER_TEMPS = len(PARTS)


def _breakdown(live: list[int], div: list[int]) -> dict[str, int]:
    parts = {p: _share(v, d) for p, v, d in zip(PARTS, live, div, strict=False)}
    parts["temporaries"] += _share(live[_OPTIMIZER_TEMPS], div[_OPTIMIZER_TEMPS])
    return parts


def _share(nbytes: int, divisor: int) -> int:
    """One device's bytes of a part divided over ``divisor`` devices; 0: the part is not on the device."""
    return -(-nbytes // divisor) if divisor else 0


_AUTOCAST = {"mixed-bf16": torch.bfloat16, "mixed-fp16": torch.float16}
_WEIGHTS = {"fp32": torch.float32, "mixed-bf16": torch.float32, "mixed-fp16": torch.float32, "bf16": torch.bfloat16}


def _fake_copy(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=dtype if t.is_floating_point() else t.dtype)


_Slots = list[tuple[dict[str, Any], str, Any]]


def _materialize(model: torch.nn.Module, dtype: torch.dtype) -> _Slots:
    """Swap the meta tensors for fake CPU ones (inside FakeTensorMode), keeping tied weights tied.

    Returns what was swapped, for ``_restore``: one meta skeleton serves several simulations.
    """
    memo: dict[int, torch.Tensor] = {}
    slots: _Slots = []
    for module in model.modules():
        tables: tuple[tuple[dict[str, Any], bool], ...] = ((module._parameters, True), (module._buffers, False))
        for table, parameter in tables:
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in memo:
                    fake = _fake_copy(t, dtype)
                    memo[id(t)] = torch.nn.Parameter(fake, requires_grad=t.requires_grad) if parameter else fake
                slots.append((table, name, t))
                table[name] = memo[id(t)]
    return slots


def _restore(slots: _Slots) -> None:
    for table, name, original in slots:
        table[name] = original


def _make_optimizer(name: str, params: list[torch.nn.Parameter], device: str = "cpu") -> torch.optim.Optimizer:
    # On CUDA tensors torch defaults to the multi-tensor (foreach) step, whose temporaries span
    # every parameter at once; on CPU tensors to the per-tensor loop.
    foreach = device == "cuda"
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=foreach)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, relative_step=False, scale_parameter=False)
    raise SimulationError(f"the {name} optimizer needs bitsandbytes kernels, which fake tensors cannot run")


def _categorize(alloc: Allocation, keys: dict[str, set[int]], vocab: int | None) -> str:
    for part in ("weights", "gradients", "optimizer_state"):
        if alloc.key in keys[part]:
            return part
    if alloc.key in keys["kernel_buffers"]:
        return "temporaries"
    if vocab and alloc.shape and alloc.shape[-1] == vocab and alloc.phase in ("forward", "backward"):
        return "logits"
    return "activations" if alloc.phase == "forward" else "temporaries"


def simulate_training(
    model: torch.nn.Module,
    config: Any,
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
    batch_size: int = 1,
    seq_len: int = 128,
    checkpointing: bool = False,
    attn_implementation: str | None = None,
    free_outputs: bool = False,
    extrapolate: bool = True,
    device: str = "cpu",
) -> Any:
    """Simulate a training step of ``model`` (built on the meta device) on fake tensors.

    A deep stack of identical blocks is simulated with 2 and 3 of them and extrapolated
    (``layer_extrapolation``), exactly, unless ``extrapolate`` is False. The model is left as it
    came (meta tensors, all its blocks, checkpointing off), so it can be simulated again.
    Returns a ``SimulatedStep`` (or an ``ExtrapolatedStep``, which answers the same questions).

    The step is the loop users write, ``outputs = model(**batch); loss = outputs.loss;
    loss.backward(); optimizer.step()``: ``outputs`` (its logits) stays alive through backward and
    the optimizer step. ``free_outputs`` models ``loss = model(**batch).loss`` instead, where
    only the loss survives the forward. ``device``: "cpu" (the CPU's kernels) or "cuda" (the
    kernels and allocator of a CUDA GPU, sm80 or later; see ``cuda/step.py``).

    Raises:
        SimulationError: the model's step cannot run on fake tensors (a data-dependent op, an
            optimizer without fake kernels, a model without a known input); the message says which.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: cpu or cuda")
    convolutions: ConvolutionKernels = (
        OneDnnConvolutions(CpuTarget.current()) if device == "cpu" else CudnnConvolutions()
    )
    kwargs = dict(
        precision=precision, optimizer=optimizer, batch_size=batch_size, seq_len=seq_len,
        checkpointing=checkpointing, attn_implementation=attn_implementation, free_outputs=free_outputs,
        device=device, convolutions=convolutions,
    )  # fmt: skip
    with _quiet(), _unpacked_inputs():
        return _simulate(model, config, extrapolate, kwargs)


@contextlib.contextmanager
def _unpacked_inputs() -> Any:
    """Tell transformers the step's sequences are not packed, as ``inputs.py`` builds them.

    Without a KV cache (training under checkpointing sets ``use_cache=False``) transformers looks
    for packed sequences in the position ids, which a fake tensor cannot show; it then builds an
    explicit S x S mask, and SDPA leaves flash attention for it. A real run reads the ids and
    passes no mask.
    """
    try:
        from transformers import masking_utils
    except ImportError:  # an older transformers, without packed-sequence detection
        yield
        return
    found = getattr(masking_utils, "find_packed_sequence_indices", None)
    if found is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = found


@contextlib.contextmanager
def _quiet() -> Any:
    """transformers' training-mode advice (use_cache off under checkpointing, deprecations) is
    not the user's concern here: the step is ours."""
    import warnings

    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(level)


def _simulate(model: torch.nn.Module, config: Any, extrapolate: bool, kwargs: dict[str, Any]) -> Any:
    from x_estimate.simulate.layer_extrapolation import ExtrapolatedStep, uniform_stack

    stack = uniform_stack(model, config) if extrapolate else None
    if stack is None:
        return _simulate_whole(model, config, **kwargs)
    parent, name = stack
    blocks, count = parent._modules[name], config.num_hidden_layers
    assert isinstance(blocks, torch.nn.ModuleList)  # uniform_stack only names a ModuleList
    steps: list[SimulatedStep] = []
    try:
        for k in (2, 3, 4):
            if k == 4 and not _overhead_grows(steps):
                break
            parent._modules[name] = torch.nn.ModuleList(list(blocks)[:k])
            config.num_hidden_layers = k
            steps.append(_simulate_whole(model, config, **kwargs))
    finally:
        parent._modules[name], config.num_hidden_layers = blocks, count
    four = steps[2] if len(steps) > 2 else None
    return ExtrapolatedStep(steps[0], steps[1], count, list(steps[1].notes), four)


def _overhead_grows(steps: list[SimulatedStep]) -> bool:
    """Whether a CUDA step's allocator overhead (reserved - peak) grew from two blocks to three:
    its growth per block is then measured from three to four (see ``ExtrapolatedStep``)."""
    two, three = steps
    if two.reserved is None or three.reserved is None:
        return False
    return three.reserved - three.peak > two.reserved - two.peak


def _simulate_whole(
    model: torch.nn.Module,
    config: Any,
    *,
    precision: str,
    optimizer: str,
    batch_size: int,
    seq_len: int,
    checkpointing: bool,
    attn_implementation: str | None,
    free_outputs: bool,
    device: str,
    convolutions: ConvolutionKernels,
) -> SimulatedStep:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from x_estimate.cuda.step import CudaStep

    if precision not in _WEIGHTS:
        raise ValueError(f"unknown precision {precision!r}")
    _set_attention(model, config, attn_implementation)
    keys: dict[str, set[int]] = {
        "weights": set(),
        "gradients": set(),
        "optimizer_state": set(),
        "kernel_buffers": set(),
    }
    conv: ConvolutionBuffers | None = None
    slots: _Slots = []
    cuda = CudaStep(enabled=device == "cuda")
    try:
        with (
            FakeTensorMode(allow_non_fake_inputs=False),
            FakeKernels(),
            cuda.kernels(),
            Ledger(block=cuda.block) as ledger,
            ConvolutionBuffers(convolutions, ledger) as conv,
        ):
            slots = _materialize(model, _WEIGHTS[precision])
            ledger.track([*model.parameters(), *model.buffers()], "weights")
            keys["weights"] = {a.key for a in ledger.alive()}
            cuda.allocate_workspaces(ledger)
            model.train()
            if checkpointing:
                _enable_checkpointing(model, cuda.recompute_context)
            inputs: StepInputs = step_inputs(model, config, batch_size=batch_size, seq_len=seq_len)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = _make_optimizer(optimizer, params, device)
            _prime(opt, params, ledger, keys)
            _one_step(model, opt, params, inputs, precision, ledger, keys, free_outputs)
            # Snapshot now: restoring the meta tensors below frees fake ones, which the ledger still sees.
            steady, events, peak_allocs = ledger.live, ledger.events(), ledger.at_peak()
            keys["kernel_buffers"] = conv.keys
            cuda.release_workspaces()
    except SimulationError:
        raise
    except Exception as exc:
        first = " ".join(str(exc).split())[:200]
        raise SimulationError(
            f"{type(model).__name__}'s step failed on fake tensors: {type(exc).__name__}: {first}"
        ) from None
    finally:
        _restore(slots)
        if checkpointing:
            disable = getattr(model, "activation_checkpointing_disable", None) or getattr(
                model, "gradient_checkpointing_disable", None
            )
            if callable(disable):
                disable()
    vocab = _vocab(model, config)
    index = {part: i for i, part in enumerate(PARTS)}
    flat = [(sign, a.key, a.nbytes, phase, index[_categorize(a, keys, vocab)]) for sign, a, phase in events]
    curve = [(part, sign * nbytes, phase) for sign, _, nbytes, phase, part in flat]
    at_peak = dict.fromkeys(PARTS, 0)
    for alloc in peak_allocs:
        at_peak[_categorize(alloc, keys, vocab)] += alloc.nbytes
    notes = [*inputs.notes, *cuda.notes(), *(conv.notes() if conv is not None else [])]
    reserved = cuda.reserved(flat)
    return SimulatedStep(
        ledger.peak, at_peak, steady, _phase_at(peak_allocs), notes, curve, reserved, flat if cuda.enabled else None
    )


def _prime(
    opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], ledger: Ledger, keys: dict[str, set[int]]
) -> None:
    """An optimizer step on zero gradients: it creates the state a first step would, at a
    fraction of a step's ops, so the one full step that follows is any later step of training."""
    ledger.phase = "optimizer"
    for p in params:
        p.grad = torch.zeros_like(p)
    keys["gradients"] |= {k for p in params if p.grad is not None and (k := ledger.key_of(p.grad)) is not None}
    opt.step()
    opt.zero_grad(set_to_none=True)


def _one_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    inputs: StepInputs,
    precision: str,
    ledger: Ledger,
    keys: dict[str, set[int]],
    free_outputs: bool,
) -> None:
    ledger.phase = "inputs"
    batch = inputs.make()
    ledger.phase = "forward"
    cast = torch.autocast("cpu", dtype=_AUTOCAST[precision]) if precision in _AUTOCAST else contextlib.nullcontext()
    with cast:
        outputs = model(**batch)
        loss = inputs.loss(outputs)
    if free_outputs:
        outputs = None
    ledger.phase = "backward"
    loss.backward()
    del loss, batch
    keys["gradients"] |= {k for p in params if p.grad is not None and (k := ledger.key_of(p.grad)) is not None}
    ledger.phase = "optimizer"
    opt.step()
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    keys["optimizer_state"] |= {k for v in states if (k := ledger.key_of(v)) is not None}
    del states
    ledger.phase = "zero_grad"
    opt.zero_grad(set_to_none=True)
    del outputs  # the loop's next forward replaces it; the steady state is measured without it


def _set_attention(model: torch.nn.Module, config: Any, attn_implementation: str | None) -> None:
    if attn_implementation is None:
        return
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(attn_implementation)
    elif config is not None:
        config._attn_implementation = attn_implementation


def _phase_at(allocs: list[Allocation]) -> str:
    last = max(allocs, key=lambda a: a.key, default=None)
    return "setup" if last is None else last.phase


def _vocab(model: torch.nn.Module, config: Any) -> int | None:
    head: Callable[[], Any] | None = getattr(model, "get_output_embeddings", None)
    with contextlib.suppress(Exception):
        out = head() if callable(head) else None
        if isinstance(out, torch.nn.Linear):
            return int(out.out_features)
    vocab = getattr(config, "vocab_size", None)
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def _enable_checkpointing(model: torch.nn.Module, recompute_context: Callable[[], Any] | None = None) -> None:
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise SimulationError(f"{type(model).__name__} does not support gradient checkpointing")
    # Non-reentrant: the variant PyTorch recommends, and the one that works with frozen inputs.
    # transformers 5 renamed gradient_checkpointing_enable and its keyword.
    ckpt: dict[str, Any] = {"use_reentrant": False}
    if recompute_context is not None:
        # The recomputation runs inside backward, where the forward's function modes are not
        # active: it must run the same kernels, or it saves other tensors and checkpoint refuses.
        ckpt["context_fn"] = lambda: (contextlib.nullcontext(), recompute_context())
    if callable(enable := getattr(model, "activation_checkpointing_enable", None)):
        enable(activation_checkpointing_kwargs=ckpt)
    elif callable(enable := getattr(model, "gradient_checkpointing_enable", None)):
        enable(gradient_checkpointing_kwargs=ckpt)
    else:
        raise SimulationError(f"{type(model).__name__} does not support gradient checkpointing")
