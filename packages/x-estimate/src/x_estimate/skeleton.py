"""Build the model on PyTorch's meta device: every parameter has a shape and a dtype, and none
has memory. Built in float32 whatever the config declares; sizes per dtype are computed later.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import Any

import torch

from x_estimate.errors import EstimateError
from x_estimate.source import _TIMM_INSTALL, ModelSource, _timm_module, hub_reachable

__all__ = ["Skeleton", "build_skeleton"]


@dataclass
class Skeleton:
    """The meta-device model and what the estimator needs to know about it."""

    model: torch.nn.Module
    library: str
    class_name: str
    note: str = ""  # why this class was built, when it is not the obvious one
    no_split: frozenset[str] = field(default_factory=frozenset)
    config: Any = None  # transformers PretrainedConfig, for attention shapes


def build_skeleton(source: ModelSource, *, base_model: bool = False, trust_remote_code: bool = False) -> Skeleton:
    """Build ``source``'s model on the meta device.

    Raises:
        EstimateError: the config cannot be turned into a model; the message says why.
    """
    if source.library == "timm":
        return _timm(source)
    return _transformers(source, base_model=base_model, trust_remote_code=trust_remote_code)


def _timm(source: ModelSource) -> Skeleton:
    timm = _timm_module()
    if timm is None:
        raise EstimateError(_TIMM_INSTALL)
    name = source.timm_name or ""
    kwargs: dict[str, Any] = {}
    if source.config is not None:
        # Hub/local timm configs carry the head size of that checkpoint.
        num_classes = source.config.get("num_classes") or (source.config.get("pretrained_cfg") or {}).get("num_classes")
        if isinstance(num_classes, int):
            kwargs["num_classes"] = num_classes
    if not timm.is_model(name):
        raise EstimateError(f"timm does not know the architecture {name!r} (timm {timm.__version__}); upgrade timm?")
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **kwargs)
    return Skeleton(model, "timm", type(model).__name__, note=f"timm.create_model({name!r})")


def _load_config(source: ModelSource, trust_remote_code: bool) -> Any:
    from huggingface_hub import constants
    from transformers import AutoConfig

    uses_remote_code = bool((source.config or {}).get("auto_map"))
    if uses_remote_code and not trust_remote_code:
        raise EstimateError(
            f"{source.name} defines its model in its own code (auto_map in config.json); read that code, "
            "then pass --trust_remote_code to run it"
        )
    # Remote code lives in the repo's .py files, which only the Hub id (not the cached
    # config.json alone) lets transformers fetch: code, never weights.
    from_hub = uses_remote_code and source.origin.startswith("Hugging Face")
    location = source.name if from_hub else str(source.config_dir)
    if from_hub and not constants.HF_HUB_OFFLINE and not hub_reachable():
        # transformers would retry for ~20 s before failing.
        raise EstimateError(
            f"{source.name} needs its code files from the Hub, which cannot be reached; pass a local folder"
        )
    _check_sizes(source)
    try:
        return AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code, token=source.token)
    except Exception as exc:
        if isinstance(exc, ValueError) and "trust_remote_code" in str(exc):
            raise EstimateError(
                f"{source.name} needs its own code to build: pass --trust_remote_code after reading it"
            ) from None
        raise EstimateError(f"{source.name}: transformers cannot read its config: {_one_line(exc)}") from None


# Sizes a model is built from: zero or a negative count makes transformers fail deep inside
# (a ZeroDivisionError), so they are checked first, by name.
_SIZE_KEYS = (
    "hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "intermediate_size",
    "vocab_size", "head_dim", "n_embd", "n_head", "n_layer", "d_model", "num_heads", "num_layers",
)  # fmt: skip


def _check_sizes(source: ModelSource) -> None:
    for key in _SIZE_KEYS:
        value = (source.config or {}).get(key)
        if isinstance(value, bool) or (value is not None and (not isinstance(value, int) or value < 1)):
            raise EstimateError(f"{source.name}: config.json sets {key} to {value!r}; it must be a positive integer")


def _one_line(exc: BaseException) -> str:
    # Whole message, on one line: transformers often puts the reason on the second line.
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _model_class(config: Any, base_model: bool, trust_remote_code: bool) -> tuple[Any, str]:
    import transformers

    if base_model:
        return transformers.AutoModel, "the bare base model (--base-model), as Accelerate builds it"
    auto_map = getattr(config, "auto_map", None)
    if trust_remote_code and isinstance(auto_map, dict):
        # The repo's own classes, even where config.architectures names a built-in one.
        tasks = [k for k in auto_map if k.startswith("AutoModelFor")] or [k for k in auto_map if k == "AutoModel"]
        if tasks:
            return getattr(transformers, tasks[0]), f"the repo's own code (auto_map {tasks[0]})"
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls, "config.architectures"
    return transformers.AutoModel, "no known class in config.architectures: the bare base model"


def _instantiate(cls: Any, config: Any, trust_remote_code: bool) -> torch.nn.Module:
    import transformers

    is_auto = cls.__name__.startswith("AutoModel")
    build = cls.from_config if is_auto else cls._from_config
    # Without an explicit dtype both default to the config's; transformers 5 calls it dtype=.
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    kwargs: dict[str, Any] = {key: torch.float32}
    if is_auto:
        kwargs["trust_remote_code"] = trust_remote_code
    with torch.device("meta"), contextlib.redirect_stderr(io.StringIO()):
        return build(config, **kwargs)


def _tie(model: torch.nn.Module, config: Any) -> None:
    """Apply the config's weight tying: transformers may skip it when building on meta."""
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    if not getattr(config, "tie_word_embeddings", False):
        return
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if not (callable(get_in) and callable(get_out)):
        return
    with contextlib.suppress(NotImplementedError, AttributeError):
        inp, out = get_in(), get_out()
        if (
            inp is not None
            and out is not None
            and out.weight is not inp.weight
            and out.weight.shape == inp.weight.shape
        ):
            out.weight = inp.weight


def _transformers(source: ModelSource, *, base_model: bool, trust_remote_code: bool) -> Skeleton:
    config = _load_config(source, trust_remote_code)
    cls, why = _model_class(config, base_model, trust_remote_code)
    try:
        model = _instantiate(cls, config, trust_remote_code)
    except Exception as exc:
        raise EstimateError(
            f"{source.name}: transformers cannot build {cls.__name__} from its config: "
            f"{type(exc).__name__}: {_one_line(exc)}"
        ) from None
    _tie(model, config)
    no_split = frozenset(getattr(model, "_no_split_modules", None) or ())
    return Skeleton(model, "transformers", type(model).__name__, note=why, no_split=no_split, config=config)
