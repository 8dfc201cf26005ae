"""The served tables of ``accelerate`` and its modules outside ``utils``, ``commands`` and ``test_utils``."""

from x_runtime.provide.table import ModuleTable

TABLES = (
    ModuleTable(
        "accelerate",
        package=True,
        x_runtime=(
            "Accelerator AutocastKwargs DataLoaderConfiguration DDPCommunicationHookType "
            "debug_launcher DeepSpeedPlugin DistributedDataParallelKwargs DistributedType "
            "find_executable_batch_size FullyShardedDataParallelPlugin GradScalerKwargs "
            "InitProcessGroupKwargs is_rich_available notebook_launcher ParallelismConfig "
            "PartialState ProfileKwargs skip_first_batches synchronize_rng_states"
        ),
        x_bigmodel=(
            "cpu_offload cpu_offload_with_hook disk_offload dispatch_model infer_auto_device_map "
            "init_empty_weights init_on_device load_checkpoint_and_dispatch load_checkpoint_in_model"
        ),
    ),
    ModuleTable(
        "accelerate.accelerator",
        x_runtime=(
            "Accelerator AcceleratorState AORecipeKwargs AutocastKwargs check_os_kernel compare_versions "
            "convert_outputs_to_fp32 DataLoaderConfiguration DataLoaderDispatcher "
            "DeepSpeedOptimizerWrapper DeepSpeedPlugin DeepSpeedSchedulerWrapper "
            "DistributedDataParallelKwargs DistributedType DummyOptim DummyScheduler "
            "extract_model_from_parallel filter_trackers FP8RecipeKwargs FullyShardedDataParallelPlugin "
            "gather gather_object GeneralTracker get_logger get_model_tp_size GradientAccumulationPlugin "
            "GradientState GradScalerKwargs InitProcessGroupKwargs is_bf16_available "
            "is_deepspeed_available is_mlu_available is_msamp_available is_musa_available "
            "is_npu_available is_torch_version is_torch_xla_available is_torchao_available "
            "is_transformer_engine_available is_xpu_available KwargsHandler load_fsdp_model "
            "load_fsdp_optimizer LOGGER_TYPE_TO_CLASS LoggerType MODEL_NAME pad_across_processes "
            "ParallelismConfig PartialState prepare_data_loader PROFILE_PATTERN_NAME ProfileKwargs "
            "ProjectConfiguration recursively_apply reduce release_memory SAFE_WEIGHTS_INDEX_NAME "
            "SAFE_WEIGHTS_NAME SAFE_WEIGHTS_PATTERN_NAME save save_fsdp_model save_fsdp_optimizer "
            "SCALER_NAME skip_first_batches TERecipeKwargs TorchDynamoPlugin WEIGHTS_INDEX_NAME "
            "WEIGHTS_NAME WEIGHTS_PATTERN_NAME"
        ),
        x_bigmodel="get_state_dict_offloaded_model has_offloaded_params",
    ),
    ModuleTable(
        "accelerate.big_modeling",
        x_runtime=(
            "is_bnb_available is_mlu_available is_musa_available is_npu_available is_sdaa_available is_xpu_available"
        ),
        x_bigmodel=(
            "add_hook_to_module AlignDevicesHook attach_align_device_hook "
            "attach_layerwise_casting_hooks cpu_offload cpu_offload_with_hook "
            "CpuOffload disk_offload dispatch_model extract_submodules_state_dict "
            "find_tied_parameters get_balanced_memory infer_auto_device_map init_empty_weights "
            "init_on_device LayerwiseCastingHook load_checkpoint_and_dispatch "
            "load_checkpoint_in_model offload_state_dict OffloadedWeightsLoader retie_parameters "
            "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING UserCpuOffloadHook"
        ),
        # The module x's dispatch reads it from: transformers' no-op swap of it reaches x.
        elsewhere={"check_device_map": "x_bigmodel.planning.device_map"},
    ),
    ModuleTable(
        "accelerate.hooks",
        x_runtime=(
            "clear_device_cache is_mlu_available is_musa_available is_npu_available PartialState send_to_device"
        ),
        x_bigmodel=(
            "add_hook_to_module AlignDevicesHook attach_align_device_hook CpuOffload find_device "
            "get_non_persistent_buffers LayerwiseCastingHook ModelHook named_module_tensors "
            "PrefixedDataset remove_hook_from_module remove_hook_from_submodules SequentialHook "
            "set_module_tensor_to_device UserCpuOffloadHook"
        ),
    ),
    ModuleTable(
        "accelerate.state",
        x_runtime=(
            "AcceleratorState DistributedType GradientAccumulationPlugin GradientState "
            "is_datasets_available is_deepspeed_available is_fp8_available is_hpu_available "
            "is_mlu_available is_mps_available is_musa_available is_npu_available is_sdaa_available "
            "is_torch_xla_available is_xpu_available PartialState"
        ),
    ),
    ModuleTable(
        "accelerate.data_loader",
        x_runtime=(
            "BatchSamplerShard broadcast broadcast_object_list compare_versions concatenate "
            "DataLoaderDispatcher DataLoaderShard DataLoaderStateMixin DistributedType "
            "find_batch_size get_logger GradientState is_datasets_available is_torch_version "
            "is_torch_xla_available is_torchdata_stateful_dataloader_available IterableDatasetShard "
            "PartialState prepare_data_loader SeedableRandomSampler send_to_device skip_first_batches "
            "SkipBatchSampler SkipDataLoader synchronize_rng_states"
        ),
    ),
    ModuleTable(
        "accelerate.optimizer",
        x_runtime="AcceleratorState DistributedType GradientState is_torch_xla_available",
    ),
    ModuleTable(
        "accelerate.scheduler",
        x_runtime="AcceleratorState GradientState",
    ),
    ModuleTable(
        "accelerate.checkpointing",
        x_runtime=(
            "get_logger is_cuda_available is_hpu_available is_mlu_available is_musa_available "
            "is_sdaa_available is_torch_version is_torch_xla_available is_xpu_available MODEL_NAME "
            "OPTIMIZER_NAME PartialState RNG_STATE_NAME SAFE_MODEL_NAME SAFE_WEIGHTS_NAME "
            "SAMPLER_NAME save SCALER_NAME SCHEDULER_NAME WEIGHTS_NAME"
        ),
    ),
    ModuleTable(
        "accelerate.tracking",
        x_runtime=(
            "AimTracker ClearMLTracker CometMLTracker compare_versions DVCLiveTracker filter_trackers "
            "GeneralTracker get_logger is_aim_available is_clearml_available is_comet_ml_available "
            "is_dvclive_available is_mlflow_available is_swanlab_available is_tensorboard_available "
            "is_trackio_available is_wandb_available listify LOGGER_TYPE_TO_CLASS LoggerType "
            "MLflowTracker PartialState register_tracker_class SwanLabTracker TensorBoardTracker "
            "TrackioTracker WandBTracker"
        ),
    ),
    ModuleTable(
        "accelerate.logging",
        x_runtime="get_logger MultiProcessAdapter PartialState",
    ),
    ModuleTable(
        "accelerate.local_sgd",
        x_runtime="Accelerator DistributedType LocalSGD",
    ),
    ModuleTable(
        "accelerate.launchers",
        x_runtime=(
            "AcceleratorState debug_launcher is_mps_available is_rocm_available is_torch_version "
            "notebook_launcher PartialState patch_environment"
        ),
    ),
    ModuleTable(
        "accelerate.parallelism_config",
        x_runtime=(
            "DeepSpeedSequenceParallelConfig DistributedType is_torch_version ParallelismConfig "
            "TorchContextParallelConfig TorchTensorParallelConfig"
        ),
    ),
)
