"""Modules and parameters of a model found by name: Accelerate's FSDP helpers that libraries call.

``get_module_class_from_name`` finds a layer class from its name (how a wrap policy's
``transformer_layer_cls_to_wrap`` strings become classes); ``get_parameters_from_modules`` turns a
list of modules, or a regular expression over module names, into their parameters (TRL passes
the modules to keep out of FSDP's sharding).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

__all__ = ["get_module_class_from_name", "get_parameters_from_modules"]


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type[torch.nn.Module] | None:
    """The class named ``name`` of ``module`` or of the first of its submodules (depth first) that has it.

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> get_module_class_from_name(model, "ReLU"), get_module_class_from_name(model, "Conv2d")
        (<class 'torch.nn.modules.activation.ReLU'>, None)
    """
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


def get_parameters_from_modules(
    modules: Iterable[torch.nn.Module] | str | None, model: torch.nn.Module, device: torch.device | str | int
) -> set[torch.nn.Parameter]:
    """The parameters of ``modules``: modules themselves, or a regular expression that module names
    of ``model`` match whole. Modules named by the expression are moved to ``device`` first, as
    Accelerate moves them (they stay out of sharding, so they must already sit where they run).

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> len(get_parameters_from_modules("1", model, "cpu")), len(get_parameters_from_modules(None, model, "cpu"))
        (2, 0)
    """
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        chosen = [module for name, module in model.named_modules() if pattern.fullmatch(name)]
        for module in chosen:
            module.to(device)
        modules = chosen
    return {parameter for module in modules for parameter in module.parameters()}
