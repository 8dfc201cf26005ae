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
from x_bigmodel.checkpoint_loading import load_checkpoint_in_model, set_module_tensor_to_device
from x_bigmodel.device_map import get_balanced_memory, get_max_memory, infer_auto_device_map, resolve_device_map
from x_bigmodel.empty_weights import init_empty_weights, init_on_device

__all__ = [
    "__version__",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_in_model",
    "resolve_device_map",
    "set_module_tensor_to_device",
]
