"""x-bigmodel: load and run models bigger than GPU memory or RAM, spread over GPU, CPU and disk.

    from x_bigmodel import init_empty_weights, infer_auto_device_map, load_checkpoint_in_model

    with init_empty_weights():
        model = MyModel(config)                       # parameters on the meta device, no memory
    device_map = infer_auto_device_map(model, max_memory={0: "20GiB", "cpu": "64GiB", "disk": "1TiB"},
                                       no_split_module_classes=["Block"])
    load_checkpoint_in_model(model, "checkpoint/", device_map=device_map, offload_folder="offload")

Names and semantics follow Accelerate's big-model API.
"""

from x_bigmodel._version import __version__
from x_bigmodel.devices.device_moves import find_device
from x_bigmodel.dispatch.align_attach import (
    align_module_device,
    attach_align_device_hook,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
)
from x_bigmodel.dispatch.align_hook import AlignDevicesHook
from x_bigmodel.dispatch.entry_points import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from x_bigmodel.dispatch.hooks import (
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from x_bigmodel.dispatch.layerwise_casting import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    LayerwiseCastingHook,
    attach_layerwise_casting_hooks,
)
from x_bigmodel.dispatch.offload_hook import CpuOffload, UserCpuOffloadHook
from x_bigmodel.loading.checkpoint import load_checkpoint_in_model, set_module_tensor_to_device
from x_bigmodel.loading.state_dict import load_state_dict
from x_bigmodel.offload.offload_files import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    load_offloaded_weights,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from x_bigmodel.planning.accelerate_sizes import (
    CustomDtype,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    named_module_tensors,
    retie_parameters,
)
from x_bigmodel.planning.auto_map import clean_device_map
from x_bigmodel.planning.device_map import (
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    resolve_device_map,
)
from x_bigmodel.planning.device_plan import DevicePlan, check_device_map
from x_bigmodel.planning.empty_weights import init_empty_weights, init_on_device
from x_bigmodel.transformers.pretrained import from_pretrained

__all__ = [
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "AlignDevicesHook",
    "CpuOffload",
    "CustomDtype",
    "DevicePlan",
    "LayerwiseCastingHook",
    "ModelHook",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "SequentialHook",
    "UserCpuOffloadHook",
    "__version__",
    "add_hook_to_module",
    "align_module_device",
    "attach_align_device_hook",
    "attach_layerwise_casting_hooks",
    "check_device_map",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "dtype_byte_size",
    "extract_submodules_state_dict",
    "find_device",
    "find_tied_parameters",
    "from_pretrained",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "offload_state_dict",
    "offload_weight",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "resolve_device_map",
    "retie_parameters",
    "save_offload_index",
    "set_module_tensor_to_device",
]
