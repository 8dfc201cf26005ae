"""Coverage: x-estimate's Total Size over every model type transformers knows.

For each type in ``CONFIG_MAPPING_NAMES``: its default config, the first class of the first
task mapping that holds it (heads before the bare model, so tying is exercised) that
transformers itself can build on the meta device. Truth: the unique parameters and buffers of
that build (transformers' own ``_from_config``, tying included), in float32. Estimate: the
config saved to a folder with that class in ``architectures``, run through x-estimate's own
source, skeleton and summary steps. The test fails below 99% exact and prints every failure.

Slow (every type, built twice): marked ``coverage``, deselected in the normal run.
``nox -s coverage-estimate`` runs it; ``X_COVERAGE_SAMPLE=N`` checks every N-th type only.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.coverage

THRESHOLD = 0.99


def _candidate_classes(model_type: str) -> list[str]:
    from transformers.models.auto import modeling_auto

    mappings = [v for k, v in vars(modeling_auto).items() if k.endswith("_MAPPING_NAMES") and isinstance(v, dict)]
    base = modeling_auto.MODEL_MAPPING_NAMES
    names: list[str] = []
    for mapping in [m for m in mappings if m is not base] + [base]:
        found = mapping.get(model_type)
        for name in found if isinstance(found, (list, tuple)) else [found] if found else []:
            # modeling_auto also holds CONFIG_MAPPING_NAMES: config classes are no candidates.
            if name not in names and not name.endswith("Config"):
                names.append(name)
    return names


def _truth(model_type: str) -> tuple[Any, str, int] | None:
    """(config, class name, float32 bytes) of the first class transformers builds; None if none does."""
    import torch
    import transformers
    from transformers import CONFIG_MAPPING

    try:
        config = CONFIG_MAPPING[model_type]()
    except Exception:
        return None
    candidates = _candidate_classes(model_type)
    # The first few heads, then the bare model: a head that fails on the default config
    # usually fails for the same reason in every task, the base model less often.
    for name in dict.fromkeys([*candidates[:3], *candidates[-1:]]):
        cls = getattr(transformers, name, None)
        if cls is None:
            continue
        try:
            with torch.device("meta"), contextlib.redirect_stderr(io.StringIO()):
                model = cls._from_config(config, dtype=torch.float32)
        except Exception:
            continue
        tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        return config, name, sum(t.numel() * t.element_size() for t in tensors.values())
    return None


def _estimate(config: Any, class_name: str, folder: Path) -> int:
    from x_common.module_sizes import sizes_of, tensor_infos
    from x_estimate.model.skeleton import build_skeleton
    from x_estimate.model.source import resolve_source

    config.architectures = [class_name]
    config.save_pretrained(folder)
    skeleton = build_skeleton(resolve_source(str(folder)))
    if skeleton.class_name != class_name:
        raise AssertionError(f"built {skeleton.class_name}")
    return sizes_of(tensor_infos(skeleton.model), "float32")[""]


def check_type(model_type: str) -> dict[str, Any]:
    """One type's verdict: buildable by transformers, and x-estimate's total against the truth."""
    warnings.simplefilter("ignore")
    os.environ["HF_HUB_OFFLINE"] = "1"
    truth = _truth(model_type)
    if truth is None:
        return {"type": model_type, "buildable": False}
    config, class_name, expected = truth
    verdict: dict[str, Any] = {"type": model_type, "buildable": True, "class": class_name, "truth": expected}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            verdict["estimate"] = _estimate(config, class_name, Path(tmp) / "model")
        except BaseException as exc:  # every failure is a finding to print
            verdict["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return verdict


def model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    names = sorted(CONFIG_MAPPING_NAMES)
    step = int(os.environ.get("X_COVERAGE_SAMPLE", "1"))
    return names[::step]


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"over {_PER_TYPE_S} s")


_PER_TYPE_S = 120


def _shard(out: str, names: list[str]) -> None:
    """Worker: check ``names`` one by one, one JSON line each (so a crash loses one type, not all)."""
    signal.signal(signal.SIGALRM, _alarm)
    with open(out, "a") as handle:
        for name in names:
            start = time.monotonic()
            signal.alarm(_PER_TYPE_S)
            try:
                verdict = check_type(name)
            except TimeoutError as exc:
                verdict = {"type": name, "buildable": True, "class": "?", "truth": -1, "error": str(exc)}
            signal.alarm(0)
            verdict["seconds"] = round(time.monotonic() - start, 2)
            handle.write(json.dumps(verdict) + "\n")
            handle.flush()


def run_all(workers: int = 2) -> list[dict[str, Any]]:
    """Every type's verdict, checked by ``workers`` processes, each its own interpreter."""
    names = model_types()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp) / f"shard{i}.jsonl") for i in range(workers)]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, out, *names[i::workers]],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i, out in enumerate(outs)
        ]
        for proc in procs:
            proc.wait()
        verdicts = [
            json.loads(line) for out in outs if Path(out).exists() for line in Path(out).read_text().splitlines()
        ]
    done = {v["type"] for v in verdicts}
    # A worker that died (killed, out of memory) leaves its remaining types unchecked: failures.
    lost = [
        {"type": n, "buildable": True, "class": "?", "truth": -1, "error": "worker died"}
        for n in names
        if n not in done
    ]
    return sorted(verdicts + lost, key=lambda v: v["type"])


def _failure(v: dict[str, Any]) -> str:
    if "error" in v:
        return f"{v['type']} ({v['class']}): {v['error']}"
    return f"{v['type']} ({v['class']}): estimate {v['estimate']:,} B vs truth {v['truth']:,} B ({v['estimate'] / v['truth'] - 1:+.1%})"


def test_total_size_is_exact_for_99_percent_of_buildable_types() -> None:
    verdicts = run_all(int(os.environ.get("X_COVERAGE_WORKERS", "2")))
    buildable = [v for v in verdicts if v["buildable"]]
    exact = [v for v in buildable if v.get("estimate") == v["truth"]]
    failures = [_failure(v) for v in buildable if v.get("estimate") != v["truth"]]
    summary = f"{len(exact)} of {len(buildable)} buildable types exact ({len(verdicts)} types checked)"
    print(summary, *failures, sep="\n")
    if out := os.environ.get("X_COVERAGE_JSON"):
        Path(out).write_text(json.dumps(verdicts, indent=1))
    assert buildable, "transformers built no model type at all"
    assert len(exact) >= THRESHOLD * len(buildable), summary + "\n" + "\n".join(failures)


if __name__ == "__main__":
    _shard(sys.argv[1], sys.argv[2:])
