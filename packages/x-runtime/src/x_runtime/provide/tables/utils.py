"""The served tables of ``accelerate.utils`` and its modules."""

from x_runtime.provide.table import ModuleTable

TABLES = (
    ModuleTable(
        "accelerate.utils",
        package=True,
        x_runtime=(
            "AORecipeKwargs AutocastKwargs broadcast broadcast_object_list CannotPadNestedTensorWarning "
            "check_os_kernel clear_environment compare_versions concatenate convert_dict_to_env_variables "
            "convert_outputs_to_fp32 convert_to_fp32 copy_tensor_to_devices DataLoaderConfiguration "
            "DDPCommunicationHookType DeepSpeedOptimizerWrapper DeepSpeedPlugin DeepSpeedSchedulerWrapper "
            "DeepSpeedSequenceParallelConfig DistributedDataParallelKwargs DistributedType DummyOptim "
            "DummyScheduler extract_model_from_parallel find_batch_size find_executable_batch_size "
            "FP8RecipeKwargs FullyShardedDataParallelPlugin gather gather_object get_model_tp_size "
            "GradientAccumulationPlugin GradScalerKwargs HfDeepSpeedConfig InitProcessGroupKwargs "
            "is_aim_available is_bf16_available is_bnb_available is_boto3_available is_clearml_available "
            "is_comet_ml_available is_cuda_available is_datasets_available is_deepspeed_available "
            "is_dvclive_available is_fp16_available is_fp8_available is_hpu_available "
            "is_matplotlib_available is_mlflow_available is_mlu_available is_mps_available "
            "is_msamp_available is_musa_available is_namedtuple is_npu_available is_pandas_available "
            "is_peft_available is_peft_model is_pytest_available is_rich_available is_rocm_available "
            "is_sdaa_available is_swanlab_available is_tensorboard_available is_timm_available "
            "is_torch_version is_torch_xla_available is_torchao_available is_torchdata_available "
            "is_torchdata_stateful_dataloader_available is_torchvision_available is_trackio_available "
            "is_transformer_engine_available is_transformers_available is_wandb_available "
            "is_xpu_available KwargsHandler listify load_fsdp_model load_fsdp_optimizer LoggerType "
            "merge_fsdp_weights MODEL_NAME OPTIMIZER_NAME pad_across_processes pad_input_tensors "
            "ParallelismConfig patch_environment PROFILE_PATTERN_NAME ProfileKwargs ProjectConfiguration "
            "purge_accelerate_environment recursively_apply reduce release_memory RNG_STATE_NAME "
            "SAFE_MODEL_NAME SAFE_WEIGHTS_INDEX_NAME SAFE_WEIGHTS_NAME SAFE_WEIGHTS_PATTERN_NAME "
            "SAMPLER_NAME save save_fsdp_model save_fsdp_optimizer SCALER_NAME SCHEDULER_NAME "
            "send_to_device set_seed synchronize_rng_states TERecipeKwargs TorchContextParallelConfig "
            "TorchDynamoPlugin TorchTensorParallelConfig tqdm WEIGHTS_INDEX_NAME WEIGHTS_NAME "
            "WEIGHTS_PATTERN_NAME"
        ),
        x_bigmodel=(
            "align_module_device check_device_map compute_module_sizes convert_file_size_to_int "
            "CustomDtype dtype_byte_size extract_submodules_state_dict find_device "
            "find_tied_parameters get_balanced_memory get_max_layer_size get_max_memory "
            "has_offloaded_params infer_auto_device_map load_checkpoint_in_model "
            "load_offloaded_weight load_offloaded_weights load_state_dict named_module_tensors "
            "offload_state_dict offload_weight OffloadedWeightsLoader PrefixedDataset "
            "retie_parameters save_offload_index set_module_tensor_to_device"
        ),
    ),
    ModuleTable(
        "accelerate.utils.constants",
        x_runtime=(
            "BETA_CP_AVAILABLE_PYTORCH_VERSION BETA_SP_AVAILABLE_DEEPSPEED_VERSION "
            "BETA_TP_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_TRANSFORMERS_VERSION "
            "FSDP2_STATE_DICT_TYPE FSDP_AUTO_WRAP_POLICY FSDP_BACKWARD_PREFETCH FSDP_MODEL_NAME "
            "FSDP_SHARDING_STRATEGY FSDP_STATE_DICT_TYPE MODEL_NAME OPTIMIZER_NAME "
            "PROFILE_PATTERN_NAME RNG_STATE_NAME SAFE_MODEL_NAME SAFE_WEIGHTS_INDEX_NAME "
            "SAFE_WEIGHTS_NAME SAFE_WEIGHTS_PATTERN_NAME SAMPLER_NAME SCALER_NAME SCHEDULER_NAME "
            "STR_OPERATION_TO_FUNC TORCH_DYNAMO_MODES WEIGHTS_INDEX_NAME WEIGHTS_NAME "
            "WEIGHTS_PATTERN_NAME"
        ),
        x_bigmodel="SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    ),
    ModuleTable(
        "accelerate.utils.dataclasses",
        x_runtime=(
            "AORecipeKwargs AutocastKwargs BETA_CP_AVAILABLE_PYTORCH_VERSION "
            "BETA_TP_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_TRANSFORMERS_VERSION "
            "compare_versions DataLoaderConfiguration DDPCommunicationHookType DeepSpeedPlugin "
            "DeepSpeedSequenceParallelConfig DistributedDataParallelKwargs DistributedType "
            "FP8RecipeKwargs FSDP_AUTO_WRAP_POLICY FSDP_BACKWARD_PREFETCH FSDP_SHARDING_STRATEGY "
            "FullyShardedDataParallelPlugin get_module_class_from_name GradientAccumulationPlugin "
            "GradScalerKwargs InitProcessGroupKwargs is_cuda_available is_hpu_available "
            "is_mlu_available is_msamp_available is_musa_available is_npu_available is_rocm_available "
            "is_torch_version is_torchao_available is_transformer_engine_available is_xpu_available "
            "KwargsHandler LoggerType ProfileKwargs ProjectConfiguration TERecipeKwargs "
            "TorchContextParallelConfig TorchDynamoPlugin TorchTensorParallelConfig"
        ),
        x_bigmodel="CustomDtype",
    ),
    ModuleTable(
        "accelerate.utils.deepspeed",
        x_runtime=(
            "compare_versions DeepSpeedOptimizerWrapper DeepSpeedSchedulerWrapper DistributedType "
            "DummyOptim DummyScheduler HfDeepSpeedConfig is_bnb_available"
        ),
    ),
    ModuleTable(
        "accelerate.utils.environment",
        x_runtime=("clear_environment convert_dict_to_env_variables patch_environment purge_accelerate_environment"),
    ),
    ModuleTable(
        "accelerate.utils.fsdp_utils",
        x_runtime=(
            "FSDP_MODEL_NAME get_logger get_module_class_from_name get_parameters_from_modules "
            "is_peft_model is_torch_version load_fsdp_model load_fsdp_optimizer merge_fsdp_weights "
            "OPTIMIZER_NAME SAFE_WEIGHTS_NAME save save_fsdp_model save_fsdp_optimizer WEIGHTS_NAME"
        ),
        x_bigmodel="get_non_persistent_buffers",
    ),
    ModuleTable(
        "accelerate.utils.imports",
        x_runtime=(
            "compare_versions is_aim_available is_bf16_available is_bnb_available is_boto3_available "
            "is_clearml_available is_comet_ml_available is_cuda_available is_datasets_available "
            "is_deepspeed_available is_dvclive_available is_fp16_available is_fp8_available "
            "is_hpu_available is_matplotlib_available is_mlflow_available is_mlu_available "
            "is_mps_available is_msamp_available is_musa_available is_npu_available "
            "is_pandas_available is_peft_available is_pytest_available is_rich_available "
            "is_rocm_available is_sdaa_available is_swanlab_available is_tensorboard_available "
            "is_timm_available is_torch_version is_torch_xla_available is_torchao_available "
            "is_torchdata_available is_torchdata_stateful_dataloader_available "
            "is_torchvision_available is_tqdm_available is_trackio_available "
            "is_transformer_engine_available is_transformers_available is_wandb_available "
            "is_xpu_available patch_environment"
        ),
    ),
    ModuleTable(
        "accelerate.utils.memory",
        x_runtime=(
            "clear_device_cache find_executable_batch_size is_cuda_available is_hpu_available "
            "is_mlu_available is_mps_available is_musa_available is_npu_available is_sdaa_available "
            "is_xpu_available release_memory should_reduce_batch_size"
        ),
    ),
    ModuleTable(
        "accelerate.utils.modeling",
        x_runtime=(
            "AcceleratorState AutocastKwargs clear_device_cache DistributedType is_hpu_available "
            "is_mlu_available is_mps_available is_musa_available is_npu_available is_peft_available "
            "is_peft_model is_sdaa_available is_torch_version is_torch_xla_available "
            "is_tqdm_available is_xpu_available SAFE_WEIGHTS_NAME tqdm WEIGHTS_INDEX_NAME "
            "WEIGHTS_NAME"
        ),
        x_bigmodel=(
            "align_module_device check_device_map clean_device_map compute_module_sizes "
            "compute_module_total_buffer_size convert_file_size_to_int CustomDtype dtype_byte_size "
            "find_tied_parameters get_balanced_memory get_max_layer_size get_max_memory "
            "get_module_size_with_ties get_non_persistent_buffers get_state_dict_from_offload "
            "get_state_dict_offloaded_model has_offloaded_params infer_auto_device_map "
            "load_checkpoint_in_model load_offloaded_weight load_offloaded_weights load_state_dict "
            "named_module_tensors offload_weight retie_parameters save_offload_index "
            "set_module_tensor_to_device"
        ),
    ),
    ModuleTable(
        "accelerate.utils.offload",
        x_bigmodel=(
            "extract_submodules_state_dict load_offloaded_weight offload_state_dict offload_weight "
            "OffloadedWeightsLoader PrefixedDataset save_offload_index"
        ),
    ),
    ModuleTable(
        "accelerate.utils.operations",
        x_runtime=(
            "AcceleratorState broadcast broadcast_object_list CannotPadNestedTensorWarning "
            "concatenate convert_outputs_to_fp32 convert_to_fp32 copy_tensor_to_devices "
            "DistributedOperationException DistributedType find_batch_size gather gather_object "
            "is_namedtuple is_npu_available is_torch_version is_torch_xla_available listify "
            "pad_across_processes pad_input_tensors PartialState recursively_apply reduce "
            "send_to_device verify_operation"
        ),
        x_bigmodel="find_device",
    ),
    ModuleTable(
        "accelerate.utils.other",
        x_runtime=(
            "check_os_kernel DistributedType extract_model_from_parallel get_logger get_model_tp_size "
            "is_deepspeed_available is_torch_version is_torch_xla_available PartialState save"
        ),
    ),
    ModuleTable(
        "accelerate.utils.random",
        x_runtime=(
            "AcceleratorState DistributedType is_hpu_available is_mlu_available is_musa_available "
            "is_npu_available is_sdaa_available is_torch_xla_available is_xpu_available set_seed "
            "synchronize_rng_states"
        ),
    ),
    ModuleTable(
        "accelerate.utils.tqdm",
        x_runtime="is_tqdm_available PartialState tqdm",
    ),
    ModuleTable(
        "accelerate.utils.versions",
        x_runtime="compare_versions is_torch_version STR_OPERATION_TO_FUNC",
    ),
)
