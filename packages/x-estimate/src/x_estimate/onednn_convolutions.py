"""oneDNN's convolutions on the CPU: the buffers they hold beyond their outputs (see ``convolution_buffers``).

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
(docs/estimate.md has the measurements). Verified on an AVX-512 CPU with AMX (oneDNN 3.12,
torch 2.13 and 2.14) against the allocator's events; AVX2's 8-channel blocks follow the same
rules, unverified.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from x_estimate.convolution_buffers import Convolution, channels_last_like, contiguous_strides, dense_in

__all__ = ["CpuTarget", "OneDnnConvolutions"]


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
