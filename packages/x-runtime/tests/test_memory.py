"""find_executable_batch_size retries smaller batches on out-of-memory, and memory is handed back."""

from __future__ import annotations

import inspect
import weakref

import pytest
import torch

from x_runtime.core import memory
from x_runtime.core.memory import (
    clear_device_cache,
    find_executable_batch_size,
    free_memory,
    release_memory,
    should_reduce_batch_size,
)


def _oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.fixture
def clears(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record cache clears instead of running them: gc.collect with torch loaded costs ~0.1 s each."""
    recorded: list[bool] = []
    monkeypatch.setattr(
        memory, "clear_device_cache", lambda garbage_collection=False: recorded.append(garbage_collection)
    )
    return recorded


def test_shrinks_by_a_tenth_until_the_batch_fits(clears: list[bool]) -> None:
    calls = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, model, lr=0.1):
        calls.append((batch_size, model, lr))
        if batch_size > 100:
            raise _oom()
        return batch_size

    # Accelerate's sequence: int(size * 0.9) after each out-of-memory error.
    assert train("net", lr=0.5) == 92
    assert calls == [(128, "net", 0.5), (115, "net", 0.5), (103, "net", 0.5), (92, "net", 0.5)]
    # once before the first attempt, once after each failed one, always with garbage collection
    assert clears == [True] * 4


def test_later_calls_start_from_the_size_that_worked(clears: list[bool]) -> None:
    calls = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size):
        calls.append(batch_size)
        if batch_size > 16:
            raise _oom()

    train()
    train()
    assert calls == [64, 57, 51, 45, 40, 36, 32, 28, 25, 22, 19, 17, 15, 15]


def test_raises_when_reaching_zero(clears: list[bool]) -> None:
    calls = []

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size):
        calls.append(batch_size)
        raise _oom()

    with pytest.raises(RuntimeError, match=r"^No executable batch size found, reached zero\.$"):
        train()
    assert calls == [8, 7, 6, 5, 4, 3, 2, 1]


def test_passing_the_batch_size_is_a_type_error() -> None:
    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size, model):
        raise AssertionError("must not run")

    with pytest.raises(TypeError, match=r"Batch size was passed into `train`.*`train\(model='net'\)`"):
        train(32, "net")
    with pytest.raises(TypeError, match="Batch size was passed"):
        train("net", batch_size=32)


def test_other_errors_propagate_unchanged(clears: list[bool]) -> None:
    calls = []
    error = ValueError("bad input")

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size):
        calls.append(batch_size)
        raise error

    with pytest.raises(ValueError) as excinfo:
        train()
    assert excinfo.value is error
    assert calls == [8]


def test_real_cpu_allocation_failure_is_retried() -> None:
    calls = []

    @find_executable_batch_size(starting_batch_size=4)
    def allocate(batch_size):
        calls.append(batch_size)
        # 2**50 bytes per sample is far beyond any address space, so malloc fails at once.
        return torch.empty(2**50 * batch_size if batch_size > 1 else 8, dtype=torch.uint8).numel()

    assert allocate() == 8
    assert calls == [4, 3, 2, 1]


def test_custom_reduction_functions(clears: list[bool]) -> None:
    calls = []

    @find_executable_batch_size(starting_batch_size=100, reduce_batch_size_fn=lambda size: size - 30)
    def train(batch_size):
        calls.append(batch_size)
        if batch_size > 50:
            raise _oom()

    train()
    assert calls == [100, 70, 40]

    # Accelerate's form: a zero-argument callable that tracks the size itself.
    sizes = iter([10, 3])
    zero_arg_calls = []

    @find_executable_batch_size(starting_batch_size=20, reduce_batch_size_fn=lambda: next(sizes))
    def evaluate(batch_size):
        zero_arg_calls.append(batch_size)
        if batch_size > 5:
            raise _oom()

    evaluate()
    assert zero_arg_calls == [20, 10, 3]


def test_failed_attempt_tensors_are_freed_before_the_cache_is_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    refs: list[weakref.ref] = []
    alive_at_clear: list[bool] = []

    def recording_clear(garbage_collection: bool = False) -> None:
        alive_at_clear.append(any(ref() is not None for ref in refs))

    monkeypatch.setattr(memory, "clear_device_cache", recording_clear)

    @find_executable_batch_size(starting_batch_size=2)
    def train(batch_size):
        activations = torch.ones(batch_size)
        refs.append(weakref.ref(activations))
        if batch_size > 1:
            raise _oom()

    train()
    # the first clear runs before any attempt; the second follows the failed attempt
    assert alive_at_clear == [False, False]


def test_wrapper_keeps_metadata_and_hides_batch_size(clears: list[bool]) -> None:
    @find_executable_batch_size
    def train(batch_size, model, *, epochs=1):
        """Train."""
        return batch_size

    assert train.__name__ == "train"
    assert train.__doc__ == "Train."
    assert list(inspect.signature(train).parameters) == ["model", "epochs"]
    assert train("net") == 128


def test_function_without_a_batch_size_parameter_is_rejected() -> None:
    with pytest.raises(TypeError, match="first positional parameter"):
        find_executable_batch_size(lambda **kwargs: None)


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("anything"),
        RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
        RuntimeError("XPU out of memory. Tried to allocate 1 GiB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."),
        RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: 8 bytes"),
    ],
)
def test_out_of_memory_errors_are_recognised(error: BaseException) -> None:
    assert should_reduce_batch_size(error)


@pytest.mark.parametrize(
    "error",
    [ValueError("CUDA out of memory"), RuntimeError("shape mismatch"), KeyboardInterrupt()],
)
def test_other_errors_are_not(error: BaseException) -> None:
    assert not should_reduce_batch_size(error)


def test_release_memory_returns_nones_and_drops_references() -> None:
    a, b = torch.ones(8), torch.zeros(8)
    ref = weakref.ref(a)
    a, b = release_memory(a, b)
    assert (a, b) == (None, None)
    assert ref() is None
    assert free_memory is release_memory


def test_clear_device_cache_empties_every_available_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append("cuda"))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: emptied.append("mps"))
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
        monkeypatch.setattr(torch.xpu, "empty_cache", lambda: emptied.append("xpu"))
    clear_device_cache(garbage_collection=True)
    assert sorted(emptied) == sorted(["cuda", "mps"] + (["xpu"] if hasattr(torch, "xpu") else []))


def test_a_starting_size_of_zero_fails_when_called_as_accelerate_does(clears: list[bool]) -> None:
    @find_executable_batch_size(starting_batch_size=0)
    def train(batch_size):
        raise AssertionError("must not run")

    with pytest.raises(RuntimeError, match=r"^No executable batch size found, reached zero\.$"):
        train()
