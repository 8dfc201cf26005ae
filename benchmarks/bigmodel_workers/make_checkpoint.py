"""Build bench_bigmodel.py's synthetic Llama checkpoint once, or reuse it when its spec matches.

    python make_checkpoint.py '{"folder": ..., "config": {...}, "shard_size": "500MB", "seed": 0}'

The model is built on the meta device, then each parameter is materialised on its own (seeded
normal(0, 0.02) for matrices, ones for the norm weights), so RAM holds the model once, plus what
`save_pretrained` needs for one shard. It is written as safetensors shards with an index, by
transformers' `save_pretrained`, into FOLDER.partial and renamed to FOLDER when complete, so an
interrupted build is never reused. FOLDER/bench-spec.json records the spec: a later run with the
same spec (and all shards present at their recorded sizes) reuses the folder. Prints one JSON line:
{"reused": bool, "seconds": float, "bytes": total size of the shards}.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

SPEC = "bench-spec.json"


def matches(folder: Path, spec: dict) -> bool:
    try:
        recorded = json.loads((folder / SPEC).read_text())
    except (OSError, ValueError):
        return False
    if recorded.get("spec") != spec:
        return False
    return all(
        (folder / name).is_file() and (folder / name).stat().st_size == size for name, size in recorded["files"].items()
    )


def build(folder: Path, spec: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**spec["config"])
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(spec["seed"])
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            value = torch.empty(param.shape, dtype=torch.float32)
            if value.ndim == 1:
                value.fill_(1.0)
            else:
                value.normal_(0.0, 0.02, generator=generator)
            module._parameters[name] = torch.nn.Parameter(value, requires_grad=False)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, max_shard_size=spec["shard_size"], safe_serialization=True)
    del model
    files = {p.name: p.stat().st_size for p in sorted(partial.iterdir()) if p.suffix == ".safetensors"}
    if len(files) < 2:
        sys.exit(f"expected a sharded checkpoint in {partial}, found {sorted(files)}")
    (partial / SPEC).write_text(json.dumps({"spec": spec, "files": files}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)


def main() -> None:
    spec = json.loads(sys.argv[1])
    folder = Path(spec.pop("folder"))
    start = time.perf_counter()
    reused = matches(folder, spec)
    if not reused:
        folder.parent.mkdir(parents=True, exist_ok=True)
        build(folder, spec)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(json.dumps({"reused": reused, "seconds": time.perf_counter() - start, "bytes": size}))


if __name__ == "__main__":
    main()
