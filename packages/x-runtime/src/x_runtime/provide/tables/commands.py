"""The served tables of ``accelerate.commands``: the config-file and launch entry points the ``trl`` CLI calls."""

from x_runtime.provide.table import ModuleTable

TABLES = (
    ModuleTable(
        "accelerate.commands",
        package=True,
    ),
    # Accelerate's console script (`accelerate launch ...`) imports this module's main.
    ModuleTable(
        "accelerate.commands.accelerate_cli",
        x_launch="launch_command_parser merge_command_parser",
        elsewhere={"main": "x_launch.cli.accelerate:accelerate_main"},
    ),
    ModuleTable(
        "accelerate.commands.config",
        package=True,
        x_launch="default_config_file load_config_from_file",
    ),
    ModuleTable(
        "accelerate.commands.launch",
        x_runtime=(
            "convert_dict_to_env_variables DistributedType is_bf16_available is_deepspeed_available "
            "is_hpu_available is_mlu_available is_musa_available is_npu_available is_rich_available "
            "is_sdaa_available is_torch_xla_available is_xpu_available patch_environment "
            "TORCH_DYNAMO_MODES"
        ),
        x_launch="default_config_file launch_command launch_command_parser load_config_from_file",
    ),
    ModuleTable(
        "accelerate.commands.merge",
        x_runtime="merge_fsdp_weights",
        x_launch="merge_command merge_command_parser",
    ),
)
