"""The served tables of ``accelerate.test_utils``: what the libraries' own test suites import."""

from x_runtime.provide.table import ModuleTable

TABLES = (
    ModuleTable(
        "accelerate.test_utils",
        package=True,
    ),
    ModuleTable(
        "accelerate.test_utils.testing",
        x_runtime=(
            "AcceleratorState compare_versions gather GradientState is_aim_available is_bnb_available "
            "is_clearml_available is_comet_ml_available is_cuda_available is_datasets_available "
            "is_deepspeed_available is_dvclive_available is_fp16_available is_fp8_available "
            "is_hpu_available is_matplotlib_available is_mlflow_available is_mlu_available "
            "is_mps_available is_musa_available is_npu_available is_pandas_available "
            "is_peft_available is_pytest_available is_sdaa_available is_swanlab_available "
            "is_tensorboard_available is_timm_available is_torch_version is_torch_xla_available "
            "is_torchao_available is_torchdata_stateful_dataloader_available is_torchvision_available "
            "is_trackio_available is_transformer_engine_available is_transformers_available "
            "is_wandb_available is_xpu_available"
        ),
        elsewhere={
            "get_backend": "x_runtime.core.testing",
            "run_command": "x_runtime.core.testing",
            "SubprocessCallException": "x_runtime.core.testing",
        },
    ),
)
