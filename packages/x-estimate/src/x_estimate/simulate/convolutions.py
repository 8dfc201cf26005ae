"""What a convolution kernel holds beyond its outputs, counted for the simulated step.

A fake convolution allocates its outputs and nothing more; the real kernels hold other buffers
for the op's duration, and a convolutional step often peaks inside one (issue 48: a small
ConvNeXt's real CPU step peaked 12 MiB above the simulation, inside the backward of its last
depthwise convolution). ``ConvolutionBuffers`` is a dispatch mode that sits above the ledger: after
each ``aten.convolution`` / ``aten.convolution_backward`` it replays the kernel's own
allocations (``kernels.events``, outputs included, in the kernel's order) and holds, for an
instant, the bytes by which their peak exceeds the outputs, so the ledger's peak is the real one.

CPU (``OneDnnConvolutions``): PyTorch runs float32 and 16-bit convolutions through oneDNN
(``aten/src/ATen/native/mkldnn/Conv.cpp``; its Note "MKLDNN Convolution Memory Formats") when
``torch._C._select_conv_backend`` says ``Mkldnn`` (PyTorch's own rules: batch, threads, kernel
size, dtype); other backends are counted as their outputs. The buffers, each a layout oneDNN
picks that differs from PyTorch's plain one, and so a copy:

- PyTorch's ``.contiguous(memory_format)`` copies of input, weight and grad_output (a 1-D
  convolution first makes its input contiguous and views it as 2-D);
- NCHW: every activation the kernel reads or writes is reordered into oneDNN's layout (channels
  blocked by 16 on AVX-512, 8 on AVX2; NHWC for the 16-bit AMX kernels, whose result needs one
  more copy on its way back), except a first layer's float32 source (fewer channels than a
  block), which oneDNN reads as it is; channels-last tensors are used in place;
- the weight, reordered into blocks for the forward and input-gradient passes;
- the weight gradient, computed into oneDNN's blocks and then copied out (and to channels-last
  on that path). Where the weight-gradient kernel is the direct one for a grouped convolution
  (channels-last input, or 16-bit; for a depthwise one, a kernel wider than 3: ConvNeXt's 7x7),
  each group is padded to a 16 x 16 block: 256 times the weight of a depthwise layer. A 16-bit
  weight gradient is accumulated in a float32 buffer of that blocked size. Depthwise kernels of
  width 3 or less keep one block per 16 groups; other NCHW grouped weight gradients (float32,
  or depthwise) go through oneDNN's GEMM kernel in plain layout.

Not counted: oneDNN's scratchpads (im2col, transposition and reduction buffers), which depend
on its kernels' internals and grow with the threads: 1.1 MiB at a 16-bit ConvNeXt's peak on one
thread, but a bfloat16 ViT patch embedding's forward holds 5.2 MiB per thread at 224 px
(docs/estimate-accuracy.md has the measurements). Verified on an AVX-512 CPU with AMX (oneDNN 3.12,
torch 2.13 and 2.14) against the allocator's events; AVX2's 8-channel blocks follow the same
rules, unverified.

CUDA (``CudnnConvolutions``, for ``device="cuda"``): from ``aten/src/ATen/native/cudnn/
ConvShared.cpp`` and ``cuda/DepthwiseConv2d.cu``, the copies PyTorch makes before calling the
kernel: input and weight to ``cudnn_conv_suggest_memory_format`` (channels-last if either is),
grad_output to the input's format and then to each pass's, and the contiguous copies of the
native depthwise kernel (NCHW depthwise, float32 and bfloat16). Not counted, and unverified on a
real GPU: cuDNN's workspace, whose engine and size cuDNN's heuristics pick at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "Convolution",
    "ConvolutionBuffers",
    "ConvolutionKernels",
    "CpuTarget",
    "CudnnConvolutions",
    "OneDnnConvolutions",
    "held_beyond_outputs",
]

_FORWARD = torch.ops.aten.convolution.default
_BACKWARD = torch.ops.aten.convolution_backward.default
_Layout = tuple[tuple[int, ...], tuple[int, ...]]  # (sizes, strides)


def held_beyond_outputs(events: Sequence[int]) -> int:
    """The most bytes a kernel's allocations (+) and frees (-) hold beyond what they leave.

    Examples:
        >>> held_beyond_outputs([100, 40, -40, 100, -100])  # a copy, a reorder, the output, the copy freed
        100
    """
    live = peak = 0
    for delta in events:
        live += delta
        peak = max(peak, live)
    return peak - live


def channels_last_like(layout: _Layout) -> bool:
    """c10's ``is_channels_last_strides_2d``: what ``suggest_memory_format`` calls channels-last.

    Examples:
        >>> channels_last_like(((8, 32, 7, 7), (1568, 1, 224, 32))), channels_last_like(((256, 1, 7, 7), (49, 49, 7, 1)))
        (True, False)
    """
    sizes, strides = layout
    if len(sizes) != 4:
        return False
    smallest = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < smallest:
            return False
        if d == 0 and smallest == strides[1]:
            return False
        smallest = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def dense_in(layout: _Layout, channels_last: bool) -> bool:
    """Whether ``.contiguous(memory_format)`` keeps the tensor (no copy): c10's contiguity rules."""
    sizes, strides = layout
    order = (1, 3, 2, 0) if channels_last and len(sizes) == 4 else tuple(reversed(range(len(sizes))))
    expected = 1
    for d in order:
        if sizes[d] != 1:
            if strides[d] != expected:
                return False
            expected *= sizes[d]
    return True


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _view4d(layout: _Layout) -> _Layout:
    """``unsqueeze(2)`` of a 3-D tensor (PyTorch's 1-D convolution runs as a 2-D one)."""
    sizes, strides = layout
    return (sizes[0], sizes[1], 1, sizes[2]), (strides[0], strides[1], strides[2] * sizes[2], strides[2])


@dataclass(frozen=True)
class Convolution:
    """One 2-D convolution call (a 1-D one as the 2-D view PyTorch runs), as its kernel sees it."""

    backward: bool
    input: _Layout
    weight: _Layout
    grad_output: _Layout | None
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    dtype: torch.dtype
    mask: tuple[bool, bool, bool] = (False, False, False)  # backward: grad input, weight, bias
    input_copy: int = 0  # bytes of the contiguous copy a 1-D input gets before its 2-D view

    @classmethod
    def of(cls, func: Any, args: Sequence[Any]) -> Convolution | None:
        """The call ``func(*args)`` describes, or None for what is not modelled (transposed, 3-D)."""
        if func is _FORWARD:
            x, w, _, stride, padding, dilation, transposed, _, groups = args[:9]
            gy, mask = None, (False, False, False)
        else:
            gy, x, w, _, stride, padding, dilation, transposed, _, groups, mask = args[:11]
        if transposed or x.dim() not in (3, 4):
            return None
        layouts = [(tuple(t.shape), tuple(t.stride())) for t in (x, w)]
        out = None if gy is None else (tuple(gy.shape), tuple(gy.stride()))
        copy = 0
        if x.dim() == 3:  # aten's view1d_as_2d: the input made contiguous, then every tensor viewed 2-D
            if not dense_in(layouts[0], channels_last=False):
                copy = x.numel() * x.element_size()
            layouts = [_view4d((layouts[0][0], contiguous_strides(layouts[0][0]))), _view4d(layouts[1])]
            out = None if out is None else _view4d(out)
            stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
        return cls(
            backward=gy is not None, input=layouts[0], weight=layouts[1], grad_output=out,
            stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=int(groups),
            dtype=x.dtype, mask=(bool(mask[0]), bool(mask[1]), bool(mask[2])), input_copy=copy,
        )  # fmt: skip

    @property
    def element(self) -> int:
        return self.dtype.itemsize

    def output_size(self) -> tuple[int, int]:
        (_, _, h, w), (_, _, kh, kw) = self.input[0], self.weight[0]
        sh, sw = self.stride
        ph, pw = self.padding
        dh, dw = self.dilation
        return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1

    def bytes_of(self, *sizes: int) -> int:
        total = self.element
        for size in sizes:
            total *= size
        return total

    @property
    def depthwise(self) -> bool:
        """One input channel per group and one output channel per group (no channel multiplier)."""
        n_out, per_group = self.weight[0][:2]
        return self.groups > 1 and per_group == 1 and n_out == self.groups

    def outputs(self) -> list[int]:
        """The bytes of what the op returns, in the order the kernel allocates them."""
        (n, c, h, w), (o, i, kh, kw) = self.input[0], self.weight[0]
        if not self.backward:
            oh, ow = self.output_size()
            return [self.bytes_of(n, o, oh, ow)]
        grad_input, grad_weight, grad_bias = self.mask
        return [
            *([self.bytes_of(n, c, h, w)] if grad_input else []),
            *([self.bytes_of(o, i, kh, kw)] if grad_weight else []),
            *([self.bytes_of(o)] if grad_bias else []),
        ]


class ConvolutionKernels(Protocol):
    """The allocations a device's convolution kernels make, outputs included, in their order."""

    name: str

    def events(self, conv: Convolution) -> list[int]: ...

    def note(self, calls: int, largest: str) -> str:
        """The report's line: what of these kernels is counted and what is not."""
        ...


class CudnnConvolutions:
    """CUDA convolutions: the layout copies PyTorch makes around cuDNN and its depthwise kernel."""

    name = "cuDNN"

    def note(self, calls: int, largest: str) -> str:
        return (
            f"convolutions: the layout copies around cuDNN counted ({calls} calls, up to {largest}); "
            "cuDNN's workspace, picked at run time, is not"
        )

    def events(self, conv: Convolution) -> list[int]:
        (n, c, h, w), (o, i, kh, kw) = conv.input[0], conv.weight[0]
        oh, ow = conv.output_size()
        x, weight, y = conv.bytes_of(n, c, h, w), conv.bytes_of(o, i, kh, kw), conv.bytes_of(n, o, oh, ow)
        # cudnn_conv_suggest_memory_format: channels-last when the input or the weight is
        layout = channels_last_like(conv.input) or channels_last_like(conv.weight)
        # Convolution.cpp: NCHW depthwise runs the native kernel (cuDNN's depthwise heuristics are fp16's)
        native = conv.groups == c and conv.groups > 1 and o % c == 0 and not layout
        events = [conv.input_copy] if conv.input_copy else []
        if not conv.backward:
            made = _copy(conv.input, layout, x) + _copy(conv.weight, layout, weight)
            events += [made, y, -made] if made else [y]
        elif native:
            events += self._native_backward(conv, x, weight, y)
        else:
            events += self._cudnn_backward(conv, layout, x, weight, y)
        if conv.backward and conv.mask[2]:
            events.append(conv.bytes_of(o))  # convolution_backward: grad_output.sum over batch and space
        if conv.input_copy:
            events.append(-conv.input_copy)
        return events

    @staticmethod
    def _native_backward(conv: Convolution, x: int, weight: int, y: int) -> list[int]:
        """conv_depthwise2d_backward_cuda_out: each tensor it reads made contiguous first."""
        assert conv.grad_output is not None
        grad_input, grad_weight, _ = conv.mask
        held = _copy(conv.grad_output, False, y)
        events = [held] if held else []
        if grad_weight:
            made = _copy(conv.input, False, x)
            events += [made, weight, -made] if made else [weight]
        if grad_input:
            made = _copy(conv.weight, False, weight)
            events += [made, x, -made] if made else [x]
        return [*events, -held] if held else events

    @staticmethod
    def _cudnn_backward(conv: Convolution, layout: bool, x: int, weight: int, y: int) -> list[int]:
        """convolution_backward and cudnn_convolution_backward (ConvShared.cpp), pass by pass."""
        assert conv.grad_output is not None
        grad_input, grad_weight, _ = conv.mask
        source = conv.input
        held = 0
        if grad_weight and (made := _copy(source, layout, x)):  # input.contiguous(backend format)
            held, source = made, _dense_layout(source[0], layout)
        target = channels_last_like(source)  # grad_output.to(input.suggest_memory_format())
        grad_out = conv.grad_output
        if channels_last_like(grad_out) != target:
            held += y
            grad_out = _dense_layout(grad_out[0], target)
        events = [held] if held else []
        if grad_input:
            fmt = channels_last_like(grad_out) or channels_last_like(conv.weight)
            made = _copy(conv.weight, fmt, weight) + _copy(grad_out, fmt, y)
            events += [x, made, -made] if made else [x]
        if grad_weight:
            fmt = channels_last_like(source) or channels_last_like(grad_out)
            made = _copy(grad_out, fmt, y) + _copy(source, fmt, x)
            events += [made, weight, -made] if made else [weight]
        return [*events, -held] if held else events


def _pad(channels: int, block: int) -> int:
    return -(-channels // block) * block


def _group_block(channels: int, block: int) -> int:
    """A group's channels in oneDNN's grouped float32 weights: blocks of 4 or 8 kept, else padded."""
    return channels if channels < block and channels in (4, 8) else _pad(channels, block)


@dataclass(frozen=True)
class CpuTarget:
    """The CPU a ``device="cpu"`` simulation runs the kernels of: read once, when it starts.

    ``capability`` is ATen's (``torch.backends.cpu.get_cpu_capability()``); oneDNN blocks
    channels by 16 on AVX-512 and by 8 on AVX2; on other CPUs its layouts are not modelled.
    """

    capability: str

    @classmethod
    def current(cls) -> CpuTarget:
        return cls(capability=torch.backends.cpu.get_cpu_capability())

    @property
    def block(self) -> int | None:
        if self.capability.startswith("AVX512"):
            return 16
        if self.capability.startswith("AVX2"):
            return 8
        return None


class OneDnnConvolutions:
    """CPU convolutions through oneDNN (see the module's docstring for what each buffer is)."""

    name = "oneDNN"

    def __init__(self, target: CpuTarget) -> None:
        self.target = target

    def note(self, calls: int, largest: str) -> str:
        return (
            f"convolutions: oneDNN's layout copies counted ({calls} calls, up to {largest} held beyond a call's "
            "outputs); its scratchpads are not"
        )

    def events(self, conv: Convolution) -> list[int]:
        outputs = conv.outputs()
        block = self.target.block
        if block is None or not _selects_onednn(conv):
            return outputs
        return _OneDnnCall(conv, block).events()


def _selects_onednn(conv: Convolution) -> bool:
    """PyTorch's own backend choice (``torch._C._select_conv_backend``, as fake tensors use it),
    asked with stand-ins of the 2-D shapes that hold no data."""
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        return conv.dtype in (torch.float32, torch.bfloat16)
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        x = torch.empty((), dtype=conv.dtype).expand(conv.input[0])
        w = torch.empty((), dtype=conv.dtype).expand(conv.weight[0])
        backend = select(
            x, w, None, list(conv.stride), list(conv.padding), list(conv.dilation), False, [0, 0], conv.groups
        )
    return str(backend).rsplit(".", 1)[-1] in ("Mkldnn", "Onednn")


class _OneDnnCall:
    """One call's allocations through PyTorch's mkldnn convolution and oneDNN's layouts."""

    def __init__(self, conv: Convolution, block: int) -> None:
        self.conv, self.block = conv, block
        self.nhwc = channels_last_like(conv.input) or channels_last_like(conv.weight)
        self.low_precision = conv.element < 4  # 16-bit: oneDNN's AMX / bf16 kernels
        (self.n, self.c, self.h, self.w), (self.o, self.i, self.kh, self.kw) = conv.input[0], conv.weight[0]
        self.oh, self.ow = conv.output_size()
        # oneDNN's first-layer kernel reads a float32 NCHW source with fewer channels than a block as it is
        self.first = conv.groups == 1 and self.c < block

    def events(self) -> list[int]:
        conv = self.conv
        copies = self._copies()
        events = [copies] if copies else []
        if not conv.backward:
            events += self._forward()
        else:
            grad_input, grad_weight, grad_bias = conv.mask
            if grad_input:
                events += self._backward_data()
            if grad_weight or grad_bias:
                events += self._backward_weights(grad_weight)
            if grad_bias:
                events.append(conv.bytes_of(self.o))
        if copies:
            events.append(-copies)
        return events

    def _copies(self) -> int:
        """PyTorch's ``.contiguous(memory_format)`` of input, weight and grad_output, held for the op."""
        conv, nhwc = self.conv, self.nhwc
        total = conv.input_copy
        if not dense_in(conv.input, nhwc):
            total += conv.bytes_of(self.n, self.c, self.h, self.w)
        if not dense_in(conv.weight, nhwc):
            total += conv.bytes_of(self.o, self.i, self.kh, self.kw)
        if conv.grad_output is not None and not dense_in(conv.grad_output, nhwc):
            total += conv.bytes_of(self.n, self.o, self.oh, self.ow)
        return total

    def _activation(self, channels: int, height: int, width: int, *, source: bool = False) -> int:
        """oneDNN's copy of an NCHW activation (0 where it uses PyTorch's tensor in place)."""
        if self.nhwc or (source and self.first and not self.low_precision):
            return 0
        blocked = self.conv.depthwise or not self.low_precision  # the 16-bit AMX kernels work in NHWC, unpadded
        return self.conv.bytes_of(self.n, _pad(channels, self.block) if blocked else channels, height, width)

    def _weight(self) -> int:
        """The weight reordered for the forward and input-gradient passes."""
        conv, b, k = self.conv, self.block, self.kh * self.kw
        if conv.depthwise:
            return conv.bytes_of(_pad(conv.groups, b), k)
        if conv.groups > 1:  # float32 keeps groups of 4 or 8 channels in blocks of their own size
            per_out = self.o // conv.groups
            if self.low_precision:
                return conv.bytes_of(conv.groups, _pad(per_out, b), _pad(self.i, 2), k)
            return conv.bytes_of(conv.groups, _group_block(per_out, b), _group_block(self.i, b), k)
        if self.first:
            return conv.bytes_of(_pad(self.o, b), self.i, k)
        inner = 2 * b if self.low_precision else b
        return conv.bytes_of(_pad(self.o, inner), _pad(self.i, inner), k)

    def _gemm_weight_gradient(self) -> bool:
        """oneDNN's GEMM kernel (plain layouts) computes this weight gradient."""
        conv = self.conv
        if conv.depthwise:
            return not self.nhwc and self.kw > 3
        return conv.groups > 1 and not self.nhwc and not self.low_precision

    def _weight_gradient(self) -> int:
        """The buffer oneDNN computes the weight gradient in."""
        conv, b, k = self.conv, self.block, self.kh * self.kw
        if self._gemm_weight_gradient():
            return conv.bytes_of(self.o, self.i, k)
        if conv.depthwise:  # jit_dw: one block per 16 groups; wider kernels: the direct kernel, 16 x 16 per group
            return conv.bytes_of(_pad(conv.groups, b), k) if self.kw <= 3 else conv.bytes_of(conv.groups, b, b, k)
        inner = 2 * b if self.low_precision else b
        if conv.groups > 1:
            return conv.bytes_of(conv.groups, _pad(self.o // conv.groups, b), _pad(self.i, inner), k)
        if self.first and not self.low_precision:
            return conv.bytes_of(_pad(self.o, b), self.i, k)
        return conv.bytes_of(_pad(self.o, b), _pad(self.i, inner), k)

    def _dense(self, nbytes: int, *, strided_data: bool = False) -> list[int]:
        """A result copied out of oneDNN's NHWC buffer (the 16-bit AMX kernels; float32's strided
        input-gradient kernel) holds one more copy meanwhile."""
        nhwc_kernel = (self.low_precision or strided_data) and not self.conv.depthwise
        return [nbytes, nbytes, -nbytes] if nhwc_kernel and not self.nhwc else [nbytes]

    def _forward(self) -> list[int]:
        (out,) = self.conv.outputs()
        weight = self._weight()
        if self.nhwc:
            return [out, weight, -weight]
        src, dst = self._activation(self.c, self.h, self.w, source=True), self._activation(self.o, self.oh, self.ow)
        return [src, weight, dst, -weight, -src, *self._dense(out), -dst]

    def _backward_data(self) -> list[int]:
        grad_input = self.conv.bytes_of(self.n, self.c, self.h, self.w)
        weight = self._weight()
        if self.nhwc:
            return [grad_input, weight, -weight]
        grad_out, grad_in = self._activation(self.o, self.oh, self.ow), self._activation(self.c, self.h, self.w)
        strided = any(step > 1 for step in self.conv.stride)
        return [grad_out, weight, grad_in, -weight, -grad_out, *self._dense(grad_input, strided_data=strided), -grad_in]

    def _backward_weights(self, grad_weight: bool) -> list[int]:
        conv = self.conv
        blocked = self._weight_gradient()
        dense = conv.bytes_of(self.o, self.i, self.kh, self.kw) if grad_weight else 0
        gemm = self._gemm_weight_gradient()
        accumulator = (
            0 if gemm or (conv.depthwise and self.kw <= 3) or not self.low_precision else blocked // conv.element * 4
        )
        if self.nhwc:
            # mkldnn_to_dense(...).to(ChannelsLast): a second copy unless the plain one already is
            sizes = (self.o, self.i, self.kh, self.kw)
            again = dense and not channels_last_like((sizes, contiguous_strides(sizes)))
            tail = [dense, dense, -dense] if again else [dense]
            return [blocked, accumulator, -accumulator, *tail, -blocked]
        source = 0 if gemm else self._activation(self.c, self.h, self.w, source=True)
        grad_out = 0 if gemm else self._activation(self.o, self.oh, self.ow)
        return [source, grad_out, blocked, accumulator, -accumulator, -source, -grad_out, dense, -blocked]


def _copy(layout: _Layout, channels_last: bool, nbytes: int) -> int:
    """Bytes ``.contiguous(memory_format)`` allocates for this tensor: 0 when it is already so."""
    return 0 if dense_in(layout, channels_last) else nbytes


def _dense_layout(sizes: Sequence[int], channels_last: bool) -> _Layout:
    if channels_last and len(sizes) == 4:
        _, c, h, w = sizes
        return tuple(sizes), (h * w * c, 1, w * c, c)
    return tuple(sizes), contiguous_strides(sizes)


class ConvolutionBuffers(TorchDispatchMode):
    """Hold each convolution's buffers beyond its outputs for an instant, above the ledger.

    ``keys`` are the ledger keys of those instants (the step counts them as temporaries).
    """

    def __init__(self, kernels: ConvolutionKernels, ledger: Any) -> None:
        super().__init__()
        self.kernels = kernels
        self.ledger = ledger
        self.keys: set[int] = set()
        self.calls = 0
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is _FORWARD or func is _BACKWARD:
            conv = Convolution.of(func, args)
            extra = 0 if conv is None else held_beyond_outputs(self.kernels.events(conv))
            if extra > 0:
                held = torch.empty(extra, dtype=torch.uint8)  # the ledger below sees it come and go
                key = self.ledger.key_of(held)
                if key is not None:
                    self.keys.add(key)
                del held
                self.calls += 1
                self.largest = max(self.largest, extra)
        return out

    def notes(self) -> list[str]:
        if not self.calls:
            return []
        return [self.kernels.note(self.calls, f"{self.largest / 2**20:.2f} MiB")]
