"""A step's measured peak (``x_runtime.memory.measure``), the guard's batch shapes, and the OOM line
said once per agent's ranks. The guard against x-estimate's plan: integration-tests/test_memory_guard.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from x_runtime.core import out_of_memory
from x_runtime.memory.guard import GuardOptions, MemoryGuard, batch_shape
from x_runtime.memory.measure import StepMeasurement, profiler_running, storage_bytes

MIB = 1 << 20


def test_the_cpu_peak_is_the_most_tensor_bytes_alive_at_once() -> None:
    weights = torch.zeros(MIB // 4)  # 1 MiB alive before the step
    measurement = StepMeasurement(torch.device("cpu"))
    assert measurement.start([weights, weights[:10]])  # a view is the same storage: counted once
    a = torch.ones(2 * MIB // 4)  # +2 MiB
    b = torch.ones(3 * MIB // 4)  # +3 MiB: 5 MiB on top, the peak
    del a, b
    c = torch.ones(MIB // 4)  # after the peak: does not raise it
    measured = measurement.stop()
    del c
    assert measured.baseline == MIB
    assert measured.allocated == 6 * MIB
    assert measured.reserved is None
    assert measured.resident is None or measured.resident > 6 * MIB


def test_a_running_profiler_is_left_alone() -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        assert profiler_running()
        assert not StepMeasurement(torch.device("cpu")).start([])
    assert not profiler_running()


def test_the_profilers_own_lines_are_held_back_and_others_passed_on() -> None:
    script = textwrap.dedent(
        """
        import os, torch
        from x_runtime.memory.measure import StepMeasurement
        older = torch.ones(1000)
        m = StepMeasurement(torch.device("cpu"))
        m.start([])
        del older  # a block from before the profile, freed in it: the allocator's warning
        os.write(2, b"the user's own line\\n")
        m.stop()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "the user's own line\n"


def test_storage_bytes_counts_each_storage_once_and_skips_meta() -> None:
    shared = torch.zeros(100)
    meta = torch.empty(1000, device="meta")
    assert storage_bytes([shared, shared[:10], shared.view(10, 10), meta, "not a tensor"]) == 400


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((), {"input_ids": torch.zeros(4, 128, dtype=torch.long)}, (4, 128)),
        ((torch.zeros(2, 7, dtype=torch.long),), {}, (2, 7)),
        ((), {"pixel_values": torch.zeros(3, 3, 224, 224)}, (3, 1)),
        ((), {"labels": torch.zeros(2)}, None),
    ],
)
def test_batch_shape_reads_the_main_input(args, kwargs, expected) -> None:
    class Vision(torch.nn.Module):
        main_input_name = "pixel_values"

    module = Vision() if "pixel_values" in kwargs else torch.nn.Linear(1, 1)
    assert batch_shape(module, args, kwargs) == expected


def test_the_first_rank_of_an_agent_to_run_out_speaks_for_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(out_of_memory.tempfile, "gettempdir", lambda: str(tmp_path))
    assert out_of_memory.first_on_host()
    assert not out_of_memory.first_on_host()  # a sibling rank a moment later: its traceback is logged only
    (marker,) = (tmp_path / "x-oom").glob("agent-*")
    import os

    os.utime(marker, (0, 0))  # a minute and more ago: an earlier failure (an elastic restart)
    assert out_of_memory.first_on_host()


def test_the_oom_line_names_the_planned_peak(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(out_of_memory.tempfile, "gettempdir", lambda: str(tmp_path))
    out_of_memory.note_batch({"input_ids": torch.zeros(8, 64, dtype=torch.long)})
    out_of_memory.note_planned_peak(3 << 30)
    try:
        error = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
        line = out_of_memory.describe_out_of_memory(0, RuntimeError, error, None)
    finally:
        out_of_memory.note_planned_peak(None)
        out_of_memory.note_batch(None)  # no shapes noted for the tests after this one
    assert "with batch {input_ids: 8x64 int64}: peak " in line
    assert "(planned 3.0 GiB for the batch)" in line


def _plain_guard(lines: list[str]) -> tuple[MemoryGuard, torch.nn.Module, torch.optim.Optimizer]:
    """A guard on a model x-estimate does not simulate: it measures, and asks no simulation process."""
    guard = MemoryGuard(
        GuardOptions(device=torch.device("cpu"), precision="no", is_main=True, compare=True), say=lines.append
    )
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard.watch(model, optimizer)
    return guard, model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(8, 64)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_copies_of_the_watched_objects_carry_no_guard() -> None:
    import copy
    import pickle

    guard, model, _ = _plain_guard([])
    holder = {"guard": guard, "options": guard.options}
    assert pickle.loads(pickle.dumps(holder))["guard"] is None
    assert copy.deepcopy(holder)["guard"] is None
    assert pickle.loads(pickle.dumps(holder))["options"] == guard.options
    clone = pickle.loads(pickle.dumps(model))  # its hook is inert: the guard watches the original only
    clone.train()
    assert clone(torch.zeros(1, 64)).shape == (1, 64)
    guard.close()


def test_a_model_it_cannot_plan_gets_the_measured_line_and_no_hooks_after() -> None:
    lines: list[str] = []
    guard, model, optimizer = _plain_guard(lines)
    for _ in range(3):
        _step(model, optimizer)
    assert len(lines) == 1
    assert lines[0].startswith("x: memory of step 2: peak ")
    assert lines[0].endswith(
        "not planned: x-estimate simulates transformers models by class and config; Linear is not one"
    )
    measured, _ = guard.report
    # Step 2 on top of 16.6 KB of weights and 32 KB of input: the output, its gradient, the weights' gradients.
    assert measured.baseline == 64 * 65 * 4 + 8 * 64 * 4
    assert measured.allocated >= measured.baseline + 64 * 65 * 4
    assert not model._forward_pre_hooks and not optimizer._optimizer_step_post_hooks  # nothing to project: closed


def test_accelerate_profile_during_the_measured_step_wins_and_a_later_step_is_measured() -> None:
    from torch.profiler import ProfilerActivity, profile

    lines: list[str] = []
    guard, model, optimizer = _plain_guard(lines)
    _step(model, optimizer)  # step 1
    model(torch.ones(8, 64))  # step 2 starts: the guard's profiler runs
    assert profiler_running()
    guard.yield_profiler()  # what Accelerator.profile() does before it starts its own
    assert not profiler_running()
    with profile(activities=[ProfilerActivity.CPU]):
        optimizer.step()  # step 2 ends under the user's profiler: nothing measured
        optimizer.zero_grad()
        _step(model, optimizer)  # step 3 starts while it runs: not measured either
    assert lines == []
    _step(model, optimizer)  # step 4: measured
    assert len(lines) == 1 and lines[0].startswith("x: memory of step 4: peak ")


def test_a_fault_of_the_guard_stops_the_guard_not_the_run() -> None:
    lines: list[str] = []
    guard, model, optimizer = _plain_guard(lines)

    def broken(*args: object) -> None:
        raise RuntimeError("a model the guard misreads")

    guard._forward_starts = broken  # type: ignore[method-assign]
    _step(model, optimizer)  # the run goes on
    _step(model, optimizer)
    assert lines == ["x: the memory guard stopped: RuntimeError: a model the guard misreads"]
    assert not model._forward_pre_hooks
