"""``torch.compile`` of the prepared model: whole, or region by region.

Regional compilation compiles each block of a repeated stack (the children of a ``ModuleList``
that share one class, e.g. transformer layers) in place with ``Module.compile``: one graph
serves every block (the cost no longer grows with depth), and parameter names, ``state_dict``
keys and checkpoints stay exactly as without compilation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch

from x_common import env
from x_runtime.core.settings import current_settings

__all__ = ["TorchDynamoPlugin", "compile_model", "repeated_blocks"]


@dataclass
class TorchDynamoPlugin:
    """Accelerate's dynamo options; ``None`` fields take the launcher's (``dynamo_config``)."""

    backend: str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    use_regional_compilation: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        settings = current_settings()  # one snapshot for every field read here
        backend = settings.get(env.DYNAMO_BACKEND) if self.backend is None else self.backend
        self.backend = str(getattr(backend, "value", backend)).lower()
        if self.backend not in env.DYNAMO_BACKENDS:
            raise ValueError(f"dynamo backend {self.backend!r} is not one of {', '.join(env.DYNAMO_BACKENDS)}")
        self.mode = settings.get(env.DYNAMO_MODE) if self.mode is None else self.mode
        if self.mode not in env.DYNAMO_MODES:
            raise ValueError(f"dynamo mode {self.mode!r} is not one of {', '.join(env.DYNAMO_MODES)}")
        if self.fullgraph is None:
            self.fullgraph = settings.get(env.DYNAMO_FULLGRAPH)
        if self.dynamic is None:
            self.dynamic = settings.get(env.DYNAMO_DYNAMIC)
        if self.use_regional_compilation is None:
            self.use_regional_compilation = settings.get(env.DYNAMO_REGIONAL)

    @property
    def enabled(self) -> bool:
        return self.backend != "no" and not self.disable

    def compile_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        if self.options:
            kwargs["options"] = dict(self.options)
        elif self.mode != "default":
            kwargs["mode"] = self.mode  # torch.compile refuses mode and options together
        return kwargs


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Children of every ``ModuleList`` whose children all share one class (outermost lists only)."""
    blocks: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            if isinstance(child, torch.nn.ModuleList) and len({type(c) for c in child}) == 1 and len(child) > 1:
                blocks.extend(child)
            else:
                visit(child)

    visit(model)
    return blocks


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """``model`` compiled as the plugin says (the same object when regional, a wrapper otherwise).

    Raises:
        ValueError: regional compilation asked for a model with no repeated blocks.
    """
    if not plugin.enabled:
        return model
    if not plugin.use_regional_compilation:
        # torch types compile() for functions; given a Module it returns one (an OptimizedModule).
        return cast(torch.nn.Module, torch.compile(model, **plugin.compile_kwargs()))
    blocks = repeated_blocks(model)
    if not blocks:
        raise ValueError(
            f"regional compilation: {type(model).__name__} has no repeated blocks (a ModuleList of one class); "
            "compile the whole model instead (use_regional_compilation=False)"
        )
    for block in blocks:
        block.compile(**plugin.compile_kwargs())
    return model
