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
from x_runtime.core import parallel_handlers
from x_runtime.core.settings import Settings
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.strategies.layout import Layout
from x_runtime.strategies.select import StrategyChoice, decide


@pytest.fixture(autouse=True)
def _no_parallelism_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PARALLELISM_CONFIG_"):
            monkeypatch.delenv(name)


@pytest.fixture
def tp_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensor parallel configs check torch's version; these tests are about the layout, not it."""
    monkeypatch.setattr(parallel_handlers, "is_torch_version", lambda operation, version: True)


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


def test_tensor_parallel_takes_a_plan_and_needs_only_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = {"layers.*.up": "colwise", "layers.*.down": "rowwise"}
    config = ParallelismConfig(tp_size=2, tp_handler=TorchTensorParallelConfig(plan=plan))
    assert config.tp_handler is not None and config.tp_handler.plan == plan
    assert ParallelismConfig(tp_size=2).tp_handler == TorchTensorParallelConfig()  # the model's own plan
    monkeypatch.setattr(parallel_handlers, "is_torch_version", lambda operation, version: False)
    with pytest.raises(ValueError, match=r"^tensor parallelism needs torch >= 2\.3\.0$"):
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


def test_accelerator_refuses_a_layout_the_world_does_not_hold() -> None:
    with pytest.raises(
        ValueError, match=r"^parallelism_config: .*dp_shard_size=2 .* spans 2 processes but this run has 1; "
    ):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2))
    with pytest.raises(TypeError, match=r"^parallelism_config must be a ParallelismConfig, got dict$"):
        Accelerator(cpu=True, parallelism_config={})  # type: ignore[arg-type]


def _decide(config: ParallelismConfig | None = None, **environ: str) -> StrategyChoice:
    return decide(settings=Settings.of(environ), parallelism_config=config)


@pytest.mark.usefixtures("tp_ready")
@pytest.mark.parametrize(
    ("sizes", "kind"),
    [
        ({}, None),  # all ones: replicas (DDP), filled in over the world by the layout
        ({"dp_replicate_size": 4}, None),
        ({"dp_shard_size": 4}, DistributedType.FSDP),
        ({"dp_replicate_size": 2, "dp_shard_size": 2}, DistributedType.FSDP),  # HSDP
        ({"tp_size": 4}, None),  # tensor parallel alone, no FSDP
        ({"dp_shard_size": 2, "tp_size": 2}, DistributedType.FSDP),
        ({"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2}, DistributedType.FSDP),
    ],
)
def test_the_layout_picks_the_strategy(sizes: dict[str, int], kind: str | None) -> None:
    choice = _decide(ParallelismConfig(**sizes))
    assert choice.kind == kind and choice.parallelism is not None
    assert choice.group.sharded == (kind is not None)


@pytest.mark.usefixtures("tp_ready")
def test_the_launchers_sizes_make_the_config_when_the_code_gives_none() -> None:
    choice = _decide(
        ACCELERATE_USE_PARALLELISM_CONFIG="true", PARALLELISM_CONFIG_DP_SHARD_SIZE="2", PARALLELISM_CONFIG_TP_SIZE="2"
    )
    assert choice.kind == DistributedType.FSDP
    assert choice.parallelism is not None and (choice.parallelism.dp_shard_size, choice.parallelism.tp_size) == (2, 2)
    # The sizes alone, without the switch, name no layout (as in Accelerate).
    assert _decide(PARALLELISM_CONFIG_TP_SIZE="2").parallelism is None


@pytest.mark.usefixtures("tp_ready")
def test_layouts_x_does_not_train_are_one_line_naming_what_runs() -> None:
    with pytest.raises(
        ValueError,
        match=r"^parallelism_config: x does not train sequence parallelism \(sp_size=2, DeepSpeed Ulysses\); for long sequences use cp_size on GPUs",
    ):
        _decide(ParallelismConfig(sp_size=2))
    with pytest.raises(
        ValueError,
        match=r"^parallelism_config: DeepSpeed trains data parallel replicas only here \(got .*tp_size=2.*\); drop the DeepSpeed",
    ):
        _decide(ParallelismConfig(dp_shard_size=2, tp_size=2), X_DISTRIBUTED_TYPE="DEEPSPEED")
    with pytest.raises(ValueError, match=r"^parallelism_config: FSDP shards over dp_shard_size, which is 1 "):
        _decide(ParallelismConfig(dp_replicate_size=2), X_DISTRIBUTED_TYPE="FSDP")
    # What accelerate launch writes for tensor parallel alone (it needs FSDP2 for any ParallelismConfig).
    assert _decide(ParallelismConfig(tp_size=2), X_DISTRIBUTED_TYPE="FSDP").kind is None
    config = ParallelismConfig(dp_shard_size=1, cp_size=2)
    with pytest.raises(ValueError, match=r"^parallelism_config: context parallelism \(cp_size=2\) runs on GPUs only"):
        Layout.build(config, rank=0, world_size=2, device_type="cpu")


def test_a_layout_without_a_config_reads_by_global_rank() -> None:
    layout = Layout.build(None, rank=3, world_size=4, device_type="cpu")
    assert (layout.dp_size, layout.dp_rank, layout.tp_size, layout.speaks_for_batch, layout.mesh) == (
        4,
        3,
        1,
        True,
        None,
    )
    assert layout.describe() == "4 processes"


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
