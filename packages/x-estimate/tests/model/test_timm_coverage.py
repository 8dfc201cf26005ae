"""Coverage: x-estimate's Total Size over timm's registry (``timm.list_models()``).

Truth: ``timm.create_model(name)`` built on the meta device, its unique parameters and buffers
in float32. Estimate: the name run through x-estimate's own source, skeleton and size steps.
Every ``X_TIMM_SAMPLE``-th architecture (default 8) is checked; ``X_TIMM_SAMPLE=1`` checks all.
Needs timm (``x-estimate[timm]``, with constraints/timm.txt): skipped without it. Marked
``coverage``, so deselected in the normal run.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

pytestmark = pytest.mark.coverage

THRESHOLD = 0.99


def check_timm(name: str) -> dict[str, Any]:
    import timm
    import torch

    from x_common.module_sizes import sizes_of, tensor_infos
    from x_estimate.model.skeleton import build_skeleton
    from x_estimate.model.source import resolve_source

    warnings.simplefilter("ignore")
    try:
        with torch.device("meta"), contextlib.redirect_stderr(io.StringIO()):
            model = timm.create_model(name, pretrained=False)
    except Exception:
        return {"name": name, "buildable": False}
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    verdict: dict[str, Any] = {
        "name": name,
        "buildable": True,
        "truth": sum(t.numel() * t.element_size() for t in tensors.values()),
    }
    try:
        skeleton = build_skeleton(resolve_source(name, "timm"))
        verdict["estimate"] = sizes_of(tensor_infos(skeleton.model), "float32")[""]
    except BaseException as exc:  # every failure is a finding to print
        verdict["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return verdict


def _failure(v: dict[str, Any]) -> str:
    if "error" in v:
        return f"{v['name']}: {v['error']}"
    return f"{v['name']}: estimate {v['estimate']:,} B vs truth {v['truth']:,} B"


def test_timm_total_size_is_exact_for_99_percent_of_the_registry() -> None:
    timm = pytest.importorskip("timm")
    names = timm.list_models()[:: int(os.environ.get("X_TIMM_SAMPLE", "8"))]
    with ProcessPoolExecutor(max_workers=int(os.environ.get("X_COVERAGE_WORKERS", "2"))) as pool:
        verdicts = list(pool.map(check_timm, names, chunksize=8))
    buildable = [v for v in verdicts if v["buildable"]]
    exact = [v for v in buildable if v.get("estimate") == v["truth"]]
    failures = [_failure(v) for v in buildable if v.get("estimate") != v["truth"]]
    summary = f"timm {timm.__version__}: {len(exact)} of {len(buildable)} buildable architectures exact"
    print(summary, *failures, sep="\n")
    assert buildable, "timm built no architecture at all"
    assert len(exact) >= THRESHOLD * len(buildable), summary + "\n" + "\n".join(failures)
