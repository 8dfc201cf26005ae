"""Device maps: budgets, sequential filling, no-split, ties, dtype, balancing, validation."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from x_bigmodel.planning.device_map import (
    DEVICE_MAP_STRATEGIES,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    resolve_device_map,
)
from x_bigmodel.planning.empty_weights import init_empty_weights

KIB = 1024
H, V = 64, 256
EMBED = V * H * 4  # 64 KiB in float32, shared with lm_head
BLOCK = 2 * H * H * 4  # 32 KiB
NORM = 2 * H * 4  # 512 B


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.Linear(H, H, bias=False)
        self.mlp = torch.nn.Linear(H, H, bias=False)


class Decoder(torch.nn.Module):
    """embed (64 KiB) -> 4 x Block (32 KiB) -> norm (512 B) -> lm_head (tied to embed)."""

    def __init__(self, n_layers: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.layers = torch.nn.ModuleList(Block() for _ in range(n_layers))
        self.norm = torch.nn.LayerNorm(H)
        self.lm_head = torch.nn.Linear(H, V, bias=False)
        self.lm_head.weight = self.embed.weight


def decoder() -> Decoder:
    with init_empty_weights():
        return Decoder()


# ---------------------------------------------------------------------------- get_max_memory


def test_max_memory_parses_orders_and_converts_the_callers_sizes_in_place() -> None:
    given = {"disk": "1GiB", "cpu": "2MiB", 1: "1MiB", "cuda:0": 500, "mps": "1KB"}
    assert get_max_memory(given) == {0: 500, 1: 2**20, "mps": 1000, "cpu": 2 * 2**20, "disk": 2**30}
    assert list(get_max_memory(given)) == [0, 1, "mps", "cpu", "disk"]
    # As Accelerate: string sizes become bytes in the caller's dict (transformers compares it with the result),
    # its keys as written.
    assert given == {"disk": 2**30, "cpu": 2 * 2**20, 1: 2**20, "cuda:0": 500, "mps": 1000}


def test_max_memory_warns_about_missing_gpus(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="x_bigmodel.planning.device_map"):
        get_max_memory({torch.cuda.device_count() + 3: "1MiB"})
    assert "CUDA device" in caplog.text


@pytest.mark.parametrize(
    ("given", "match"),
    [({"tpu": 1}, "invalid device 'tpu'"), ({-1: 1}, "GPU indices are >= 0"), ({"cpu": "1XB"}, "unknown unit 'XB'")],
)
def test_max_memory_rejects_bad_input(given: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_max_memory(given)


def test_max_memory_rejects_same_device_twice() -> None:
    with pytest.raises(ValueError, match="given twice"):
        get_max_memory({0: 1, "cuda:0": 2})


def test_default_max_memory_has_host_budget_and_visible_gpus() -> None:
    budgets = get_max_memory()
    host = "mps" if torch.backends.mps.is_available() else "cpu"
    assert budgets[host] >= 0
    assert [k for k in budgets if isinstance(k, int)] == list(range(torch.cuda.device_count()))
    assert "disk" not in budgets


@pytest.mark.requires_cuda(1)
def test_default_gpu_budget_is_below_free_memory() -> None:
    free, _ = torch.cuda.mem_get_info(0)
    assert 0 < get_max_memory()[0] < free


# ------------------------------------------------------------------------- sequential filling

NO_SPLIT = ["Block"]


def test_sequential_fill_over_two_gpus() -> None:
    device_map = infer_auto_device_map(
        decoder(), {0: 100 * KIB, 1: 100 * KIB, "cpu": "1MiB"}, no_split_module_classes=NO_SPLIT
    )
    # Everything fits on the GPUs, so no room is kept for offloaded layers.
    assert device_map == {
        "embed": 0,
        "layers.0": 0,
        "layers.1": 1,
        "layers.2": 1,
        "layers.3": 1,
        "norm": 1,
        "lm_head": 0,
    }


def test_everything_on_one_device_is_merged_to_the_root() -> None:
    assert infer_auto_device_map(decoder(), {0: "1MiB"}, NO_SPLIT) == {"": 0}
    assert infer_auto_device_map(decoder(), {"cpu": "1MiB"}, NO_SPLIT) == {"": "cpu"}


def test_clean_result_false_keeps_every_unit() -> None:
    device_map = infer_auto_device_map(decoder(), {0: "1MiB"}, NO_SPLIT, clean_result=False)
    assert device_map == dict.fromkeys(["embed", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "lm_head"], 0)


def test_offloading_keeps_room_for_the_largest_remaining_layer_on_gpu0() -> None:
    # Without reservation embed + layers.0 (96 KiB) would fit in 100 KiB; with one block (32 KiB)
    # kept free for offloaded layers only the embedding does.
    device_map = infer_auto_device_map(decoder(), {0: 100 * KIB, "cpu": "1MiB"}, NO_SPLIT)
    assert device_map == {"embed": 0, "layers": "cpu", "norm": "cpu", "lm_head": 0}


def test_disk_used_only_when_budgeted_and_cpu_keeps_room() -> None:
    budgets = {0: 100 * KIB, "cpu": 80 * KIB, "disk": "1GiB"}
    device_map = infer_auto_device_map(decoder(), budgets, NO_SPLIT)
    # GPU 0 and the CPU each keep one block (32 KiB) free: 68 KiB for embed+lm_head on GPU 0,
    # 48 KiB (one block) on the CPU, the rest on disk.
    assert device_map == {
        "embed": 0,
        "layers.0": "cpu",
        "layers.1": "disk",
        "layers.2": "disk",
        "layers.3": "disk",
        "norm": "disk",
        "lm_head": 0,
    }
    # Without a disk budget the same model does not fit.
    with pytest.raises(ValueError, match="every device is full"):
        infer_auto_device_map(decoder(), {0: 100 * KIB, "cpu": 80 * KIB}, NO_SPLIT)


def test_no_split_respected() -> None:
    # 40 KiB per GPU: a block (32 KiB) fits once per GPU; without no-split its linears straddle.
    budgets = {0: 80 * KIB, 1: 80 * KIB, 2: 80 * KIB, "cpu": "1MiB"}
    model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList(Block() for _ in range(5))}).to("meta")
    whole = infer_auto_device_map(model, budgets, NO_SPLIT)
    assert whole == {"layers.0": 0, "layers.1": 0, "layers.2": 1, "layers.3": 1, "layers.4": 2}
    split = infer_auto_device_map(model, {0: 48 * KIB, 1: 48 * KIB, 2: "1MiB"})
    assert split == {"layers.0": 0, "layers.1.attn": 0, "layers.1.mlp": 1, "layers.2": 1, "layers.3": 2, "layers.4": 2}
    kept = infer_auto_device_map(model, {0: 48 * KIB, 1: 48 * KIB, 2: "1MiB"}, NO_SPLIT)
    assert kept == {"layers.0": 0, "layers.1": 1, "layers.2": 2, "layers.3": 2, "layers.4": 2}


def test_tied_weights_share_a_device_and_count_once() -> None:
    # 64 KiB for embed + lm_head together: counted twice it would need 128 KiB.
    device_map = infer_auto_device_map(decoder(), {0: 65 * KIB, 1: "1MiB"}, NO_SPLIT)
    assert device_map == {"embed": 0, "layers": 1, "norm": 1, "lm_head": 0}


def test_tie_goes_to_first_occurrence_even_with_a_late_head() -> None:
    model = decoder()
    device_map = infer_auto_device_map(model, {0: 96 * KIB, 1: 96 * KIB, "cpu": "1MiB"}, NO_SPLIT)
    assert device_map["lm_head"] == device_map["embed"] == 0


def test_float16_halves_sizes() -> None:
    fp32 = infer_auto_device_map(decoder(), {0: 100 * KIB, 1: 100 * KIB}, NO_SPLIT)
    fp16 = infer_auto_device_map(decoder(), {0: 50 * KIB, 1: 50 * KIB}, NO_SPLIT, dtype=torch.float16)
    assert fp16 == fp32
    assert infer_auto_device_map(decoder(), {0: 100 * KIB, 1: 100 * KIB}, NO_SPLIT, dtype="float16") == {"": 0}


def test_special_dtypes_override_dtype() -> None:
    sizes_kept = {"embed.weight": torch.float32}
    device_map = infer_auto_device_map(
        decoder(), {0: 50 * KIB, 1: "1MiB"}, NO_SPLIT, dtype=torch.float16, special_dtypes=sizes_kept
    )
    assert device_map == {"": 1}  # the 64 KiB float32 embedding no longer fits GPU 0


def test_cannot_fit_names_module_size_and_largest_budget() -> None:
    with pytest.raises(ValueError) as info:
        infer_auto_device_map(decoder(), {0: 16 * KIB, "cpu": 20 * KIB}, NO_SPLIT)
    message = str(info.value)
    assert "'embed' + 'lm_head' (64.00 KiB)" in message
    assert "larger than the largest budget, 20.00 KiB on 'cpu'" in message
    assert "'disk' budget" in message


def test_cannot_fit_when_budgets_are_full() -> None:
    with pytest.raises(ValueError, match=r"cannot place module 'layers.2' \(32.00 KiB\): every device is full"):
        infer_auto_device_map(decoder(), {0: 100 * KIB, "cpu": 60 * KIB}, NO_SPLIT)


def test_root_leaf_or_no_split_root_is_one_unit() -> None:
    layer = torch.nn.Linear(4, 4, device="meta")
    assert infer_auto_device_map(layer, {0: 1000}) == {"": 0}
    with pytest.raises(ValueError, match="cannot place module ''"):
        infer_auto_device_map(layer, {0: 10, 1: 70})


def test_verbose_prints_decisions(capsys: pytest.CaptureFixture[str]) -> None:
    infer_auto_device_map(decoder(), {0: 100 * KIB, "cpu": "1MiB"}, NO_SPLIT, verbose=True)
    out = capsys.readouterr().out
    assert "embed, lm_head (64.00 KiB) -> 0" in out
    assert "planning again" in out


def test_buffers_of_offloaded_modules_warn_when_no_gpu_room() -> None:
    class WithBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(64, 64, bias=False)
            self.register_buffer("table", torch.zeros(64, 64))

    model = torch.nn.Sequential(WithBuffer(), WithBuffer(), WithBuffer()).to("meta")
    # Each unit is 32 KiB (16 KiB of it buffer): all go to the CPU, 48 KiB of buffers > 40 KiB.
    with pytest.warns(UserWarning, match=r"buffers of offloaded modules \(48.00 KiB\)"):
        assert infer_auto_device_map(model, {0: 40 * KIB, "cpu": "1MiB"}, ["WithBuffer"]) == {"": "cpu"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        infer_auto_device_map(model, {0: 40 * KIB, "cpu": "1MiB"}, ["WithBuffer"], offload_buffers=True)


# ------------------------------------------------------------------------------- balancing


def test_balanced_memory_splits_evenly() -> None:
    budgets = get_balanced_memory(decoder(), {0: "1MiB", 1: "1MiB", "cpu": "2MiB"}, NO_SPLIT)
    # Best contiguous split: [embed+lm_head, layers.0] = 96 KiB | [layers.1-3, norm] = 96.5 KiB.
    assert budgets == {0: 3 * BLOCK + NORM, 1: 2**20, "cpu": 2 * 2**20}
    device_map = infer_auto_device_map(decoder(), budgets, NO_SPLIT)
    assert device_map == {
        "embed": 0,
        "layers.0": 0,
        "layers.1": 1,
        "layers.2": 1,
        "layers.3": 1,
        "norm": 1,
        "lm_head": 0,
    }


def test_balanced_low_0_leaves_gpu0_empty() -> None:
    budgets = get_balanced_memory(decoder(), {0: "1MiB", 1: "1MiB", 2: "1MiB"}, NO_SPLIT, low_zero=True)
    assert budgets[0] == 0 and budgets[1] == 3 * BLOCK + NORM and budgets[2] == 2**20
    assert resolve_device_map(decoder(), "balanced_low_0", {0: "1MiB", 1: "1MiB", 2: "1MiB"}, NO_SPLIT) == {
        "embed": 1,
        "layers.0": 1,
        "layers.1": 2,
        "layers.2": 2,
        "layers.3": 2,
        "norm": 2,
        "lm_head": 1,
    }


def test_balanced_without_room_fills_everything() -> None:
    given = {0: 50 * KIB, 1: 50 * KIB, "cpu": "1MiB"}
    assert get_balanced_memory(decoder(), given, NO_SPLIT) == get_max_memory(given)
    assert get_balanced_memory(decoder(), {0: 5, "cpu": 7}, NO_SPLIT) == {0: 5, "cpu": 7}


# ------------------------------------------------------------------------ resolve_device_map


@pytest.mark.parametrize("strategy", ["auto", "balanced"])
def test_auto_and_balanced_spread(strategy: str) -> None:
    budgets = {0: "1MiB", 1: "1MiB", "cpu": "2MiB"}
    assert resolve_device_map(decoder(), strategy, budgets, NO_SPLIT)["layers.3"] == 1


def test_sequential_fills_first_gpu() -> None:
    assert resolve_device_map(decoder(), "sequential", {0: "1MiB", 1: "1MiB"}, NO_SPLIT) == {"": 0}
    assert "sequential" in DEVICE_MAP_STRATEGIES


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match=r"unknown device_map 'fastest'.*balanced_low_0"):
        resolve_device_map(decoder(), "fastest")


def test_dict_is_validated_and_normalised() -> None:
    given = {"embed": "cuda:0", "layers": torch.device("cpu"), "norm": "disk", "lm_head": 0}
    assert resolve_device_map(decoder(), given) == {"embed": 0, "layers": "cpu", "norm": "disk", "lm_head": 0}
    assert resolve_device_map(decoder(), {"": "cpu"}) == {"": "cpu"}
    # A more specific entry overrides its parent's.
    assert resolve_device_map(decoder(), {"": 0, "layers.3": "cpu"}) == {"": 0, "layers.3": "cpu"}


def test_dict_unknown_name_suggests_nearest() -> None:
    with pytest.raises(ValueError, match=r"'layer.0'.*did you mean 'layers.0'\?"):
        resolve_device_map(decoder(), {"embed": 0, "layer.0": 0})


def test_dict_missing_tensors_are_named() -> None:
    with pytest.raises(ValueError, match=r"does not place layers.3.attn.weight, layers.3.mlp.weight, norm.weight"):
        resolve_device_map(decoder(), {"embed": 0, "layers.0": 0, "layers.1": 0, "layers.2": 0, "lm_head": 0})


def test_dict_tied_on_two_devices_rejected() -> None:
    with pytest.raises(ValueError, match=r"embed\.weight, lm_head\.weight is mapped to different devices"):
        resolve_device_map(decoder(), {"embed": 0, "layers": 0, "norm": 0, "lm_head": 1})


def test_dict_bad_device_value() -> None:
    with pytest.raises(ValueError, match=r"device_map\['embed'\]: invalid device 'gpu'"):
        resolve_device_map(decoder(), {"": 0, "embed": "gpu"})
