"""The parts of a ``--device cuda`` simulation: SDPA's kernel choice, the allocator model, the CLI."""

from __future__ import annotations

import pytest
import torch

from x_estimate.cuda.caching_allocator import CachingAllocator, block_size, replay
from x_estimate.cuda.kernels import pick

MIB = 1 << 20


def _qkv(dtype: torch.dtype, heads: int = 8, kv_heads: int = 8, head: int = 64):
    return torch.empty(1, heads, 16, head, dtype=dtype), torch.empty(1, kv_heads, 16, head, dtype=dtype)


@pytest.mark.parametrize(
    ("dtype", "mask", "gqa", "head", "backend"),
    [
        (torch.bfloat16, False, False, 64, "flash"),
        (torch.float16, False, True, 128, "flash"),  # flash reads grouped heads
        (torch.bfloat16, True, False, 64, "efficient"),  # an explicit mask: not flash
        (torch.bfloat16, False, False, 512, "efficient"),  # flash stops at head size 256
        (torch.float32, False, False, 64, "efficient"),  # flash is 16-bit only
        (torch.float32, False, True, 64, "math"),  # the memory-efficient kernel takes no GQA
        (torch.float32, False, False, 60, "math"),  # unaligned head size
    ],
)
def test_sdpa_backend_follows_torchs_cuda_rules(dtype, mask, gqa, head, backend) -> None:
    q, k = _qkv(dtype, kv_heads=4 if gqa else 8, head=head)
    attn_mask = torch.ones(1, 1, 16, 16, dtype=torch.bool) if mask else None
    assert pick(q, k, k, attn_mask=attn_mask, enable_gqa=gqa) == backend


def test_blocks_round_to_512_bytes() -> None:
    assert [block_size(n) for n in (1, 512, 513, 3 * MIB + 1)] == [512, 512, 1024, 3 * MIB + 512]


def test_small_requests_share_a_2_mib_segment_and_large_ones_a_20_mib_one() -> None:
    a = CachingAllocator()
    small = [a.malloc(100_000) for _ in range(20)]  # 20 x 98 KiB in one 2 MiB segment
    assert a.reserved == 2 * MIB
    a.malloc(5 * MIB)  # under 10 MiB: a 20 MiB segment, split
    a.malloc(5 * MIB)  # the rest of it
    assert a.reserved == 22 * MIB
    a.malloc(11 * MIB + 1)  # 10 MiB and over: rounded up to 2 MiB
    assert a.reserved == 22 * MIB + 12 * MIB
    for addr in small:
        a.free(addr)
    a.malloc(MIB + MIB // 2)  # the large pool's 10 MiB rest, not the freed small blocks
    assert a.reserved == 34 * MIB
    a.malloc(9 * MIB)  # 8.5 MiB left there: a new segment
    assert a.reserved == 54 * MIB


def test_freed_neighbours_merge_and_best_fit_reuses_them() -> None:
    a = CachingAllocator()
    x, y = a.malloc(4 * MIB), a.malloc(4 * MIB)
    a.malloc(4 * MIB)  # keeps the rest of the segment apart
    a.free(x)
    a.free(y)  # merged with x: 8 MiB free
    a.malloc(7 * MIB)  # into the merged 8 MiB block (best fit, lowest address)
    assert a.reserved == 20 * MIB
    # The large pool splits only when more than 1 MiB would remain: the 7 MiB request holds 8 MiB.
    assert a.allocated == 4 * MIB + 8 * MIB


def test_a_second_step_meets_the_first_steps_segments() -> None:
    step = [(1, 1, 30 * MIB), (1, 2, 30 * MIB), (-1, 1, 0), (-1, 2, 0)]
    peaks = replay([(1, 0, 100 * MIB), *step], again=step)
    assert peaks.reserved == 160 * MIB  # the second step reuses the first's two 30 MiB segments
    assert peaks.allocated == 160 * MIB


def test_cli_plans_with_the_gpu_step_when_asked_whether_it_fits(model_dir, configs, cli) -> None:
    folder = model_dir(configs.llama())
    args = (folder, "--dtypes", "bfloat16", "--seq-len", "64", "--batch-size", "2")
    planned = cli(*args, "--fits", "1GiB", "--json").json
    training = planned["rows"][0]["training"]
    assert planned["options"]["device"] == "cuda"
    assert training["reserved_bytes"] >= training["peak_bytes"] >= 64 * MIB  # two cuBLAS workspaces at least
    assert training["reserved_bytes"] % (2 * MIB) == 0  # whole segments
    # mixed-bf16 under CUDA autocast: q, k, v cast to bf16, so GQA runs in flash (the CPU's rules differ)
    assert any("SDPA kernel: flash" in n for n in planned["assumptions"]), planned["assumptions"]
    again = cli(*args, "--fits", "1GiB", "--json").json["rows"][0]["training"]  # from the simulation cache
    assert again["reserved_bytes"] == training["reserved_bytes"]
    cpu = cli(*args, "--fits", "1GiB", "--device", "cpu", "--json").json["rows"][0]["training"]
    assert cpu["reserved_bytes"] is None
    assert cpu["peak_bytes"] < training["peak_bytes"]
    table = cli(*args, "--device", "cuda").out
    assert "Reserved (CUDA)" in table
    assert "Reserved (CUDA)" not in cli(*args).out


def test_an_extrapolated_reserved_figure_keeps_the_allocators_overhead() -> None:
    from x_estimate.simulate.layer_extrapolation import ExtrapolatedStep
    from x_estimate.simulate.step import PARTS, SimulatedStep

    def step(peak: int, reserved: int) -> SimulatedStep:
        parts = {**dict.fromkeys(PARTS, 0), "activations": peak}
        return SimulatedStep(peak, parts, 0, "forward", [], [(PARTS.index("activations"), peak, "forward")], reserved)

    # Overhead over the peak: 50 with two blocks, 30 with three: held at 30, not on its line to 0.
    ten = ExtrapolatedStep(step(100, 150), step(120, 150), 10)
    assert (ten.peak, ten.reserved) == (260, 290)
    # A growing overhead (20, then 30) follows its line: 30 + 7 x 10 at ten blocks.
    growing = ExtrapolatedStep(step(100, 120), step(120, 150), 10)
    assert (growing.peak, growing.reserved) == (260, 360)


def test_activation_checkpointing_recomputes_with_the_gpus_kernels(model_dir, configs, cli) -> None:
    # The recomputation runs inside backward, outside the forward's kernel mode: it must switch the
    # mode on again, or it saves other tensors than the forward did and torch.utils.checkpoint refuses.
    folder = model_dir(configs.llama(num_attention_heads=4, num_key_value_heads=4, attention_dropout=0.1))
    args = (folder, "--dtypes", "bfloat16", "--seq-len", "256", "--batch-size", "4", "--device", "cuda", "--json")
    plain = cli(*args).json
    ckpt = cli(*args, "--activation-checkpointing").json
    assert not any("formulas, because" in n for n in ckpt["assumptions"]), ckpt["assumptions"]
    plain_training, ckpt_training = plain["rows"][0]["training"], ckpt["rows"][0]["training"]
    assert ckpt_training["method"] == "simulate"
    assert ckpt_training["activation_peak_bytes"] < plain_training["activation_peak_bytes"]
    # the recomputed blocks' SDPA calls are not counted again: one call per block, as without checkpointing
    assert [n for n in ckpt["assumptions"] if "SDPA kernel" in n] == [
        n for n in plain["assumptions"] if "SDPA kernel" in n
    ]
