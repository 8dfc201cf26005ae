"""ParallelismConfig: sizes from arguments and Accelerate's variables, checks, mesh layout, handlers."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import x_runtime
from x_runtime import (
    Accelerator,
    DeepSpeedSequenceParallelConfig,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
from x_runtime.accelerator.parallelism import check_parallelism
from x_runtime.core import parallel_handlers
from x_runtime.process.topology.distributed_type import DistributedType


@pytest.fixture(autouse=True)
def _no_parallelism_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PARALLELISM_CONFIG_"):
            monkeypatch.delenv(name)


@pytest.fixture
def tp_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensor parallel configs check transformers' version; these tests are about the layout, not it."""
    monkeypatch.setattr(parallel_handlers, "_installed_at_least", lambda package, version: True)


# --- layout ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("tp_ready")
@pytest.mark.parametrize(
    ("sizes", "names", "shape"),
    [
        ({}, (), ()),
        ({"dp_replicate_size": 4}, ("dp_replicate",), (4,)),
        ({"dp_shard_size": 2, "dp_replicate_size": 3}, ("dp_replicate", "dp_shard"), (3, 2)),
        ({"tp_size": 2, "dp_shard_size": 4}, ("dp_shard", "tp"), (4, 2)),
        ({"tp_size": 2, "cp_size": 3, "dp_shard_size": 2}, ("dp_shard", "cp", "tp"), (2, 3, 2)),
        ({"sp_size": 2, "dp_shard_size": 2}, ("dp_shard", "sp"), (2, 2)),
    ],
)
def test_mesh_dimensions_in_fixed_order(sizes: dict[str, int], names: tuple[str, ...], shape: tuple[int, ...]) -> None:
    config = ParallelismConfig(**sizes)
    assert config._get_mesh() == (names, shape)
    assert config.total_size == (torch.Size(shape).numel() if shape else 1)


@pytest.mark.usefixtures("tp_ready")
def test_dimension_groups() -> None:
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2, cp_size=2)
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert config.non_dp_dim_names == ["tp", "cp"]
    assert config.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert config.dp_cp_dim_names == ["dp_replicate", "dp_shard", "cp"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert (config.data_parallel_size, config.non_data_parallel_size, config.total_size) == (4, 4, 16)
    assert ParallelismConfig(dp_shard_size=8).fsdp_dim_names == ["dp_shard_cp"]


@pytest.mark.usefixtures("tp_ready")
def test_build_device_mesh_flattens_the_joint_dimensions(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    class FakeMesh:
        device_type = "cpu"

        def __getitem__(self, dims: list[str]) -> Any:
            mesh = self

            class Sub:
                def _flatten(self, name: str) -> None:
                    calls.append((tuple(dims), name))

            assert mesh is self
            return Sub()

    def fake_init(device_type: str, shape: tuple[int, ...], mesh_dim_names: tuple[str, ...]) -> FakeMesh:
        calls.append((device_type, shape, mesh_dim_names))
        return FakeMesh()

    monkeypatch.setattr(torch.distributed.device_mesh, "init_device_mesh", fake_init)
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2, tp_size=2)
    mesh = config.get_device_mesh("cpu")
    assert calls == [
        ("cpu", (2, 2, 2, 2), ("dp_replicate", "dp_shard", "cp", "tp")),
        (("dp_replicate", "dp_shard"), "dp"),
        (("dp_shard", "cp"), "dp_shard_cp"),
        (("dp_replicate", "dp_shard", "cp"), "dp_cp"),
    ]
    assert config.get_device_mesh() is mesh  # built once, kept
    with pytest.raises(
        ValueError, match=r"^ParallelismConfig.get_device_mesh: the mesh was built for 'cpu', not 'cuda'$"
    ):
        config.get_device_mesh("cuda")


def test_no_mesh_without_parallel_dimensions_or_under_deepspeed_sp() -> None:
    assert ParallelismConfig().build_device_mesh("cpu") is None
    assert ParallelismConfig(sp_size=2, dp_shard_size=2).build_device_mesh("cpu") is None
    with pytest.raises(ValueError, match="pass device_type"):
        ParallelismConfig().get_device_mesh()


# --- sizes from Accelerate's variables ---------------------------------------------------------


@pytest.mark.usefixtures("tp_ready")
def test_unset_sizes_come_from_accelerates_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig(dp_replicate_size=3, cp_size=2)
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size) == (3, 4, 2, 2)
    assert config.cp_handler == TorchContextParallelConfig(cp_comm_strategy="alltoall")
    assert isinstance(config.tp_handler, TorchTensorParallelConfig)
    assert config.sp_handler is None and (config.cp_backend, config.sp_backend) == ("torch", "deepspeed")
    assert ParallelismConfig(dp_shard_size=1).dp_shard_size == 1  # an argument beats the variable


def test_a_malformed_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "two")
    with pytest.raises(ValueError, match=r"^PARALLELISM_CONFIG_CP_SIZE='two' is not valid: expected an integer >= 1$"):
        ParallelismConfig()


# --- checks ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("tp_ready")
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": 0}, r"^ParallelismConfig: tp_size=0 is not valid: expected an integer >= 1$"),
        ({"dp_shard_size": 2.5}, r"^ParallelismConfig: dp_shard_size=2.5 is not valid"),
        ({"cp_backend": "ring"}, r"^ParallelismConfig: cp_backend='ring' is not valid: expected one of \('torch',\)$"),
        ({"sp_backend": "torch"}, r"^ParallelismConfig: sp_backend='torch' is not valid"),
        ({"cp_size": 2, "sp_size": 2}, r"exclude each other; set one of them to 1$"),
        ({"dp_replicate_size": 2, "tp_size": 2}, r"needs dp_shard_size > 1 when dp_replicate_size > 1"),
        ({"cp_size": 2, "cp_handler": DeepSpeedSequenceParallelConfig()}, r"takes a TorchContextParallelConfig"),
    ],
)
def test_bad_configurations_fail_in_one_line(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as excinfo:
        ParallelismConfig(**kwargs)
    assert "\n" not in str(excinfo.value)


def test_context_parallel_strategy_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TorchContextParallelConfig().cp_comm_strategy == "allgather"
    with pytest.raises(ValueError, match=r"^Invalid cp_comm_strategy: ring; expected one of allgather, alltoall$"):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "bogus")
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: bogus"):
        ParallelismConfig(cp_size=2)


def test_sequence_parallel_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = DeepSpeedSequenceParallelConfig()
    assert (handler.sp_seq_length, handler.sp_seq_length_is_variable, handler.sp_attn_implementation) == (
        None,
        True,
        None,
    )
    assert ParallelismConfig(sp_size=2).sp_handler == handler
    assert DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2").sp_seq_length is None
    for name in ("eager", "foobar"):
        with pytest.raises(ValueError, match=f"^Invalid sp_attn_implementation: {name};"):
            DeepSpeedSequenceParallelConfig(sp_attn_implementation=name)
    with pytest.raises(ValueError, match="sp_seq_length_is_variable=False needs sp_seq_length"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "4096")
    assert DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False).sp_seq_length == 4096
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    assert DeepSpeedSequenceParallelConfig().sp_seq_length == 4096


def test_tensor_parallel_needs_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel_handlers, "_installed_at_least", lambda package, version: False)
    with pytest.raises(ValueError, match=r"^TP requires transformers >= 4\.52\.0$"):
        ParallelismConfig(tp_size=2)


def test_to_json_leaves_out_the_mesh() -> None:
    assert ParallelismConfig(dp_shard_size=2, cp_size=2).to_json() == {
        "dp_replicate_size": 1,
        "dp_shard_size": 2,
        "tp_size": 1,
        "cp_size": 2,
        "cp_backend": "torch",
        "sp_size": 1,
        "sp_backend": "deepspeed",
        "tp_handler": None,
        "cp_handler": {"cp_comm_strategy": "allgather"},
        "sp_handler": None,
    }


def test_accelerates_version_thresholds_are_exported() -> None:
    assert (x_runtime.BETA_TP_AVAILABLE_PYTORCH_VERSION, x_runtime.BETA_CP_AVAILABLE_PYTORCH_VERSION) == (
        "2.3.0",
        "2.6.0",
    )
    assert x_runtime.BETA_TP_AVAILABLE_TRANSFORMERS_VERSION == "4.52.0"
    assert x_runtime.BETA_SP_AVAILABLE_DEEPSPEED_VERSION == "0.18.2"


# --- the Accelerator ---------------------------------------------------------------------------


def test_accelerator_keeps_a_data_parallel_config() -> None:
    config = ParallelismConfig()
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    assert accelerator.parallelism_config is config and config.total_size == 1
    assert Accelerator(cpu=True).parallelism_config is None


@pytest.mark.usefixtures("tp_ready")
def test_accelerator_refuses_what_x_does_not_train() -> None:
    with pytest.raises(ValueError, match=r"^parallelism_config: x trains data parallel layouts only .* not tp_size=2$"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    with pytest.raises(ValueError, match=r"total_size 2 .* does not match num_processes 1$"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2))


@pytest.mark.parametrize(
    ("kind", "field"), [(DistributedType.MULTI_GPU, "dp_replicate_size"), (DistributedType.FSDP, "dp_shard_size")]
)
def test_an_all_ones_config_takes_every_rank_in_the_strategys_dimension(kind: DistributedType, field: str) -> None:
    config = check_parallelism(ParallelismConfig(), num_processes=4, distributed_type=kind)
    assert config is not None and getattr(config, field) == 4 and config.total_size == 4


def test_fsdp_refuses_replicas_and_ddp_takes_any_data_parallel_split() -> None:
    with pytest.raises(ValueError, match=r"HSDP \(dp_replicate_size=2 under FSDP\)"):
        check_parallelism(
            ParallelismConfig(dp_replicate_size=2, dp_shard_size=2),
            num_processes=4,
            distributed_type=DistributedType.FSDP,
        )
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    assert check_parallelism(config, num_processes=4, distributed_type=DistributedType.MULTI_GPU) is config
    with pytest.raises(TypeError, match=r"^parallelism_config must be a ParallelismConfig, got dict$"):
        check_parallelism({}, num_processes=1, distributed_type=DistributedType.NO)  # type: ignore[arg-type]


# --- get_model_tp_size ---------------------------------------------------------------------------


def test_model_tp_size_from_the_model_or_its_config() -> None:
    model = torch.nn.Linear(2, 2)
    assert x_runtime.get_model_tp_size(model) is None
    model.tp_size = 2  # transformers < 5
    assert x_runtime.get_model_tp_size(model) == 2
    model.tp_size = None  # transformers >= 5: a stub on the model, the degree in the config
    model.config = SimpleNamespace(distributed_config=SimpleNamespace(tp_size=4))
    assert x_runtime.get_model_tp_size(model) == 4
    model.config = SimpleNamespace(distributed_config={"tp_size": 8})  # a config read back from JSON
    assert x_runtime.get_model_tp_size(model) == 8
    model.config = SimpleNamespace(distributed_config=None)
    assert x_runtime.get_model_tp_size(model) is None
