"""Accelerate's names that x exports: state views, ``is_*_available``, ``patch_environment``,
the DDP extras, ``LocalSGD``, ``profile`` and the FSDP checkpoint functions (``notebook_launcher``
has test_notebook_launcher.py).

Multi-process behaviour runs on real processes: ``compat_names_worker.py`` under torchrun (gloo on
CPU).
"""

from __future__ import annotations

import enum
import os
import pickle
import sys

import pytest
import torch

import x_runtime
from x_runtime import (
    Accelerator,
    AcceleratorState,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradientState,
    LocalSGD,
    PartialState,
    ProfileKwargs,
    merge_fsdp_weights,
    patch_environment,
)

# --- state views -------------------------------------------------------------------------------


# Accelerate's definition (a str enum named DistributedType): the repr prints as it formats here.
AccelerateDistributedType = enum.Enum("DistributedType", {"NO": "NO", "MULTI_CPU": "MULTI_CPU"}, type=str)


ACCELERATE_NO = f"{AccelerateDistributedType.NO}"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 formats a str enum as its value")
def test_state_repr_prints_the_enum_as_accelerate_does_on_python_3_11() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    assert repr(accelerator.state) == (  # Accelerate 1.15.0's text, side by side on 1 process
        "Distributed environment: DistributedType.NO\nNum processes: 1\nProcess index: 0\n"
        "Local process index: 0\nDevice: cpu\n\nMixed precision type: bf16\n"
    )


def test_partial_state_alone_reads_a_single_process() -> None:
    state = PartialState(cpu=True)
    assert (state.process_index, state.num_processes, state.local_process_index) == (0, 1, 0)
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed and state.initialized
    assert state.distributed_type == DistributedType.NO and state.device.type == "cpu"
    assert repr(state) == (
        f"Distributed environment: {ACCELERATE_NO}\nNum processes: 1\nProcess index: 0\nLocal process index: 0\n"
        "Device: cpu\n"
    )
    with state.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]
    assert state.on_main_process(lambda: 1)() == 1
    assert state.on_process(lambda: 2, process_index=0)() == 2
    assert state.on_last_process(lambda: 3)() == 3
    with state.main_process_first(), state.local_main_process_first():
        state.wait_for_everyone()


def test_accelerator_state_is_a_view_and_two_accelerators_stay_independent() -> None:
    first, second = Accelerator(cpu=True), Accelerator(cpu=True, mixed_precision="bf16")
    assert isinstance(first.state, AcceleratorState)
    assert first.state.num_processes == first.num_processes == 1 and first.state.process_index == 0
    assert first.state.world_size == 1 and first.state.rank == 0  # x's own names read through
    assert (first.state.mixed_precision, second.state.mixed_precision) == ("no", "bf16")
    first.state.distributed_type = DistributedType.FSDP
    assert first.distributed_type == "FSDP" and second.state.distributed_type == DistributedType.NO
    assert repr(second.state).endswith("Mixed precision type: bf16\n")
    AcceleratorState._reset_state(reset_partial_state=True)  # nothing shared: nothing to reset
    assert second.state.num_processes == 1


def test_accelerator_state_alone_takes_the_launchers_mixed_precision() -> None:
    with patch_environment(x_mixed_precision="bf16"):
        assert AcceleratorState(cpu=True).mixed_precision == "bf16"
    assert AcceleratorState(cpu=True, mixed_precision="no").mixed_precision == "no"


def test_a_pickled_accelerator_keeps_its_state() -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=2))
    copy = pickle.loads(pickle.dumps(accelerator))
    assert accelerator.state.__dict__ == copy.state.__dict__
    assert copy.state.num_processes == 1


def test_gradient_state_is_built_from_a_plugin_as_accelerate_builds_it() -> None:
    state = GradientState(GradientAccumulationPlugin(num_steps=4, adjust_scheduler=False))
    assert (state.num_steps, state.adjust_scheduler, state.sync_gradients) == (4, False, True)
    GradientState._reset_state()
    assert isinstance(Accelerator(cpu=True).gradient_state, GradientState)


def test_distributed_type_compares_with_its_names() -> None:
    assert PartialState(cpu=True).distributed_type == DistributedType.NO == "NO"
    assert DistributedType.MULTI_CPU in ("MULTI_CPU",)


# --- availability checks and patch_environment -----------------------------------------------------


def test_availability_checks_answer_as_accelerate_does_on_a_cpu_machine() -> None:
    cuda = torch.cuda.is_available()
    assert x_runtime.is_cuda_available() is cuda
    assert x_runtime.is_bf16_available() is (torch.cuda.is_bf16_supported() if cuda else True)
    assert x_runtime.is_fp16_available() is True
    assert x_runtime.is_rocm_available() is (torch.version.hip is not None and cuda)
    for name in ("hpu", "npu", "mlu", "sdaa", "musa"):
        assert getattr(x_runtime, f"is_{name}_available")() is False  # no vendor extension installed here
    assert x_runtime.is_torch_xla_available() is False
    assert x_runtime.is_pytest_available() is True
    assert x_runtime.is_xpu_available() is bool(torch.xpu.is_available())
    assert x_runtime.is_mps_available() is bool(torch.backends.mps.is_available())
    for name in ("bnb", "datasets", "deepspeed", "transformers", "tensorboard", "wandb", "mlflow", "ipex"):
        assert isinstance(getattr(x_runtime, f"is_{name}_available")(), bool)


@pytest.mark.parametrize("name", ["aim", "clearml", "comet_ml", "dvclive", "swanlab", "trackio", "tensorboard"])
def test_tracker_availability_matches_accelerates(name: str) -> None:
    accelerate_utils = pytest.importorskip("accelerate.utils")
    assert getattr(x_runtime, f"is_{name}_available")() is bool(getattr(accelerate_utils, f"is_{name}_available")())


def test_patch_environment_sets_upper_cased_variables_and_restores_them(monkeypatch) -> None:
    monkeypatch.setenv("X_PATCH_KEPT", "old")
    with patch_environment(x_patch_kept=1, x_patch_new="v"):
        assert (os.environ["X_PATCH_KEPT"], os.environ["X_PATCH_NEW"]) == ("1", "v")
    assert os.environ["X_PATCH_KEPT"] == "old" and "X_PATCH_NEW" not in os.environ


# --- prepare, DDP extras, LocalSGD and profile on one process ---------------------------------------


def test_ddp_kwargs_keep_the_comm_hook_out_of_ddps_arguments() -> None:
    kwargs = DistributedDataParallelKwargs(comm_hook="power_sgd", comm_wrapper=DDPCommunicationHookType.FP16)
    assert kwargs.to_kwargs() == {}
    assert kwargs.comm_hook_spec() == ("power_sgd", "fp16", {})
    assert DistributedDataParallelKwargs().comm_hook_spec() is None
    with pytest.raises(ValueError, match="comm_wrapper"):
        DistributedDataParallelKwargs(comm_wrapper="power_sgd")


def test_single_process_join_trigger_local_sgd_and_profile_do_nothing_harmful(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with accelerator.join_uneven_inputs([model], even_batches=False), accelerator.trigger_sync_in_backward(model):
        model(torch.ones(1, 2)).sum().backward()
    with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1
    with accelerator.profile(ProfileKwargs(output_trace_dir=str(tmp_path), record_shapes=True)) as profiler:
        model(torch.ones(1, 2))
    assert (tmp_path / "profile_0.json").exists() and profiler.events()
    with pytest.raises(ValueError, match="activities"):
        ProfileKwargs(activities=["gpu"]).build()


def test_merge_refuses_a_folder_that_is_not_a_checkpoint(tmp_path) -> None:
    (tmp_path / "ckpt" / "pytorch_model_fsdp_0").mkdir(parents=True)
    (tmp_path / "ckpt" / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"")
    with pytest.raises(ValueError, match="pytorch_model_fsdp_0 instead"):
        merge_fsdp_weights(tmp_path / "ckpt", tmp_path / "out")
    with pytest.raises(ValueError, match="no such folder"):
        merge_fsdp_weights(tmp_path / "missing", tmp_path / "out")


# --- two real processes -------------------------------------------------------------------------------


def test_accelerate_names_on_two_processes(workers) -> None:
    ranks = workers("compat_names_worker.py", 2)
    zero, one = ranks
    assert zero["partial"] == [0, 2, 0, True] and one["partial"] == [1, 2, 1, False]
    assert zero["state"] == [0, 2, False, True] and one["state"] == [1, 2, True, True]
    assert zero["type_is_multi_cpu"] and zero["standalone_state_type"] == "MULTI_CPU"
    assert zero["repr_head"] == [
        f"Distributed environment: {AccelerateDistributedType.MULTI_CPU}  Backend: gloo",
        "Num processes: 2",
    ]
    assert (zero["share"], one["share"]) == ([1, 2], [3])
    assert (zero["main_only"], one["main_only"]) == ("ran", None)
    # Join over gloo: rank 0 trains its second batch while rank 1, out of data, shadows it.
    assert (zero["joined_batches"], one["joined_batches"]) == ([0, 1], [0])
    assert zero["overridden"] is False and zero["restored"] is True
    assert "only supported for multi-GPU" in zero["non_ddp_warning"][0]
    assert zero["other_accelerator_unchanged"] == "MULTI_CPU"
    # Inside no_sync each rank keeps its own gradient; trigger_sync_in_backward averages them.
    assert (zero["grad_no_sync"], one["grad_no_sync"]) == ([[1.0, 1.0]], [[2.0, 2.0]])
    assert zero["grad_triggered"] == one["grad_triggered"] == [[1.5, 1.5]]
    assert zero["hook_registered"] and zero["hooked_grad"] == [[1.5, 1.5]]
    # LocalSGD: ranks drift apart after one step, agree after the averaging at step 2.
    assert zero["local_after_1"] != one["local_after_1"]
    assert zero["local_after_2"] == one["local_after_2"]
    assert zero["trace"] and one["trace"]
    # FSDP next to the DDP accelerators: its own state, theirs unchanged.
    assert zero["fsdp_type"] == "FSDP" and zero["first_type_after_fsdp"] == "MULTI_CPU"
    assert zero["shards"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert zero["merged_equal"] is True
    assert zero["loaded_equal"] and one["loaded_equal"]


def test_version_checks_compare_as_accelerate_does() -> None:
    from x_runtime.utils import compare_versions, is_torch_version

    assert is_torch_version(">=", "2.4") and not is_torch_version("<", "2.4")
    assert is_torch_version("==", torch.__version__.split("+")[0]) is (
        torch.__version__ == torch.__version__.split("+")[0]
    )
    assert compare_versions("1.10.0", ">", "1.9") and compare_versions("2.13.0+cpu", ">=", "2.13")
    assert compare_versions("torch", "!=", "0.1")  # a distribution name: its installed version
    with pytest.raises(
        ValueError, match=r"`operation` must be one of \['>', '>=', '==', '!=', '<=', '<'\], received =>"
    ):
        compare_versions("torch", "=>", "2.0")


def test_clear_environment_empties_it_and_gives_back_exactly_what_was_there(monkeypatch) -> None:
    from x_runtime.utils import clear_environment

    monkeypatch.setenv("X_TEST_KEPT", "1")
    before = dict(os.environ)
    with clear_environment():
        assert dict(os.environ) == {}
        os.environ["X_TEST_ADDED"] = "2"
    assert dict(os.environ) == before


def test_extract_model_from_parallel_removes_wrappers_and_optionally_the_fp32_forward() -> None:
    from x_runtime.utils import extract_model_from_parallel

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    inner = torch.nn.Sequential(torch.nn.Linear(2, 2))
    prepared = accelerator.prepare(inner)
    assert extract_model_from_parallel(torch.nn.DataParallel(prepared)) is inner
    assert prepared(torch.ones(1, 2)).dtype == torch.float32  # the fp32 output wrapper stays by default
    parent = torch.nn.Sequential(torch.nn.DataParallel(torch.nn.Linear(2, 2)))
    extract_model_from_parallel(parent, recursive=True)
    assert isinstance(parent[0], torch.nn.Linear)
    extract_model_from_parallel(prepared, keep_fp32_wrapper=False)
    assert "forward" not in inner.__dict__


def test_accelerates_private_lists_of_prepared_objects_are_read_as_trainer_reads_them() -> None:
    """transformers' Trainer checks ``len(accelerator._models)``; Accelerate's tests pickle an
    accelerator and read its loaders back through ``_dataloaders``."""
    import pickle

    accelerator = Accelerator(cpu=True)
    assert (accelerator._models, accelerator._optimizers, accelerator._dataloaders) == ([], [], [])
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(10)))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert accelerator._models == [model] and accelerator._optimizers == [optimizer]
    assert accelerator._dataloaders == [loader] and accelerator._schedulers == []
    copy = pickle.loads(pickle.dumps(accelerator))
    assert [batch[0].tolist() for batch in copy._dataloaders[0]] == [[i] for i in range(10)]
    accelerator.free_memory()
    assert (accelerator._models, accelerator._optimizers, accelerator._dataloaders) == ([], [], [])


# --- FP8RecipeKwargs: Accelerate's deprecated fp8 recipe --------------------------------------------


def test_fp8_recipe_kwargs_warns_and_is_the_te_recipe_by_default() -> None:
    with pytest.warns(FutureWarning, match="FP8RecipeKwargs is deprecated") as caught:
        recipe = x_runtime.FP8RecipeKwargs(fp8_format="E4M3")
    assert caught[0].filename == __file__  # the warning points at the caller
    assert isinstance(recipe, x_runtime.TERecipeKwargs)
    assert (recipe.backend, recipe.fp8_format) == ("TE", "E4M3")
    with pytest.warns(FutureWarning):
        assert x_runtime.FP8RecipeKwargs(backend="te").backend == "TE"
    with pytest.warns(FutureWarning):
        Accelerator(cpu=True, kwargs_handlers=[x_runtime.FP8RecipeKwargs()])  # accepted as a TE recipe is
    with pytest.warns(FutureWarning):
        recipe = x_runtime.FP8RecipeKwargs()
    with pytest.raises(ValueError, match=r"^TERecipeKwargs: x_runtime runs fp8 through torchao"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[recipe])  # and refused under fp8 as it is


def test_fp8_recipe_kwargs_refuses_ms_amp_in_one_line() -> None:
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match=r"^FP8RecipeKwargs\(backend='msamp'\): x has no MS-AMP; "),
    ):
        x_runtime.FP8RecipeKwargs(backend="msamp")
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="`backend` must be 'TE' or 'MSAMP', got 'tpu'"):
        x_runtime.FP8RecipeKwargs(backend="tpu")


def test_fp8_recipe_kwargs_reads_its_backend_from_accelerates_variable(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "msamp")
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=r"^FP8RecipeKwargs\(backend='msamp'\)"):
        x_runtime.FP8RecipeKwargs()
    with pytest.warns(FutureWarning):
        assert x_runtime.FP8RecipeKwargs(backend="te").backend == "TE"  # an argument wins over the variable
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "te")
    with pytest.warns(FutureWarning):
        assert x_runtime.FP8RecipeKwargs().backend == "TE"


def test_fp8_recipe_kwargs_has_accelerates_fields() -> None:
    dataclasses = pytest.importorskip("accelerate.utils.dataclasses", reason="compares with Accelerate 1.15.0")
    import dataclasses as dc

    theirs = {field.name for field in dc.fields(dataclasses.FP8RecipeKwargs)}
    ours = {field.name for field in dc.fields(x_runtime.FP8RecipeKwargs)}
    # x's TERecipeKwargs has no MXFP8 block scaling switch (fp8 runs through torchao), so neither has this.
    assert theirs - ours == {"use_mxfp8_block_scaling"} and ours <= theirs
