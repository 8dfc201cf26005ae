"""Build the model on PyTorch's meta device: every parameter has a shape and a dtype, and none
has memory. Built in float32 whatever the config declares; sizes per dtype are computed later.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import Any

import torch

from x_estimate.model.config_checks import check_config, suspicious_sizes
from x_estimate.model.errors import EstimateError
from x_estimate.model.source import TIMM_INSTALL, ModelSource, hub_reachable, timm_module

__all__ = ["Skeleton", "build_skeleton", "model_of_class"]


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


def model_of_class(class_name: str, config: dict[str, Any]) -> torch.nn.Module:
    """transformers' ``class_name`` built on the meta device from ``config`` (its ``to_dict()``).

    For a running script whose model class is known (the runtime's memory guard), where
    ``build_skeleton`` starts from a file or a Hub id.

    Raises:
        EstimateError: transformers has no such class, or cannot build it from ``config``.
    """
    import transformers

    cls = getattr(transformers, class_name, None)
    config_class = getattr(cls, "config_class", None)
    if cls is None or config_class is None:
        raise EstimateError(f"transformers {transformers.__version__} has no model class {class_name}")
    try:
        built = config_class.from_dict(dict(config))
        model = _instantiate(cls, built, trust_remote_code=False)
    except Exception as exc:
        raise EstimateError(f"transformers cannot build {class_name} from its config: {_one_line(exc)}") from None
    _tie(model, built)
    return model


def _timm(source: ModelSource) -> Skeleton:
    timm = timm_module()
    if timm is None:
        raise EstimateError(TIMM_INSTALL)
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
    # The file that was read, not its folder's config.json (``x-estimate ./folder/big.json``);
    # remote code needs the folder, where its .py files lie.
    location = source.name if from_hub else str(source.config_dir if uses_remote_code else source.config_file)
    if from_hub and not constants.HF_HUB_OFFLINE and not hub_reachable():
        # transformers would retry for ~20 s before failing.
        raise EstimateError(
            f"{source.name} needs its code files from the Hub, which cannot be reached; pass a local folder"
        )
    check_config(source.name, source.config)
    try:
        return AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code, token=source.token)
    except Exception as exc:
        if isinstance(exc, ValueError) and "trust_remote_code" in str(exc):
            raise EstimateError(
                f"{source.name} needs its own code to build: pass --trust_remote_code after reading it"
            ) from None
        raise EstimateError(
            f"{source.name}: transformers cannot read its config: {_one_line(exc)}{suspicious_sizes(source.config)}"
        ) from None


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
    is_auto = cls.__name__.startswith("AutoModel")
    build = cls.from_config if is_auto else cls._from_config
    # Without an explicit dtype both default to the config's; transformers 5 calls it dtype=.
    key = "dtype" if _transformers_major() >= 5 else "torch_dtype"
    kwargs: dict[str, Any] = {key: torch.float32}
    if is_auto:
        kwargs["trust_remote_code"] = trust_remote_code
    with torch.device("meta"), contextlib.redirect_stderr(io.StringIO()):
        return build(config, **kwargs)


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _tie(model: torch.nn.Module, config: Any) -> None:
    """Tie the weights the class ties, as loading it would.

    transformers 5 ties what the class declares (``_tied_weights_keys``, through
    ``tie_weights()``): LUKE's entity head or Pop2Piano's decoder embeddings are not tied to the
    word embeddings even with ``tie_word_embeddings``, so nothing more is tied here. Older
    versions may skip tying on meta, so the output embeddings are tied to the input ones there.
    """
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        with contextlib.suppress(Exception):
            tie()
    if _transformers_major() >= 5 or not getattr(config, "tie_word_embeddings", False):
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
            f"{type(exc).__name__}: {_one_line(exc)}{suspicious_sizes(source.config)}"
        ) from None
    _tie(model, config)
    no_split = frozenset(getattr(model, "_no_split_modules", None) or ())
    return Skeleton(model, "transformers", type(model).__name__, note=why, no_split=no_split, config=config)
