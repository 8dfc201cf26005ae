"""Run Python API calls on bad input, in one process, and report what each raised.

    python api_driver.py setup CASES.json
    python api_driver.py run CASES.json RESULTS.json

``CASES.json`` is ``{"root": folder, "cases": {id: {"setup": code, "call": code, "env": {...}}}}``.
``setup`` runs each case's ``setup`` code in ``root/<id>`` (building its checkpoints and folders);
``run`` runs each ``call`` there with the case's environment variables set, and writes
``{id: {"type": name, "mro": [names], "message": str}}``, or ``{"returned": repr}`` when the call
raised nothing; it also prints ``id: type: message`` per case, for a person reading the log. The
test compares the case folders between the two steps. Both steps import torch once for all cases,
which keeps the suite fast on small machines.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any


def _namespace() -> dict[str, Any]:
    """What setup and call code can use: torch, the x APIs, and small models and files."""
    import torch
    from safetensors.torch import save_file
    from torch import nn

    import x_bigmodel
    import x_runtime

    class Tied(nn.Module):
        """An embedding and an LM head sharing one weight, as in most language models."""

        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.mid = nn.Linear(8, 8)
            self.head = nn.Linear(8, 16, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.mid(self.emb(x)))

    def mlp(out: int = 4) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, out))

    def empty(factory: Any = mlp) -> nn.Module:
        with x_bigmodel.init_empty_weights():
            return factory()

    def save(model: nn.Module, path: str) -> None:
        """A safetensors checkpoint of ``model``, each tied tensor stored once."""
        seen: set[int] = set()
        tensors = {}
        for name, tensor in model.state_dict(keep_vars=True).items():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                tensors[name] = tensor.detach().contiguous()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, path)

    def save_tensors(tensors: dict[str, torch.Tensor], path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, path)

    def write(path: str, data: str | bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            Path(path).write_bytes(data)
        else:
            Path(path).write_text(data)

    def truncate(path: str, drop: int) -> None:
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[:-drop])

    namespace: dict[str, Any] = {
        "torch": torch,
        "nn": nn,
        "json": json,
        "os": os,
        "Path": Path,
        "Tied": Tied,
        "mlp": mlp,
        "empty": empty,
        "save": save,
        "save_tensors": save_tensors,
        "write": write,
        "truncate": truncate,
        "Accelerator": x_runtime.Accelerator,
        "x_runtime": x_runtime,
    }
    namespace.update({name: getattr(x_bigmodel, name) for name in x_bigmodel.__all__})
    return namespace


def _setup(spec: dict[str, Any]) -> None:
    root = Path(spec["root"])
    for case_id, case in spec["cases"].items():
        folder = root / case_id
        folder.mkdir(parents=True, exist_ok=True)
        os.chdir(folder)
        exec(case.get("setup") or "", _namespace())


def _run(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    root = Path(spec["root"])
    results: dict[str, dict[str, Any]] = {}
    for case_id, case in spec["cases"].items():
        os.chdir(root / case_id)
        saved = {name: os.environ.get(name) for name in case.get("env", {})}
        os.environ.update(case.get("env", {}))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = eval(compile(case["call"], f"<{case_id}>", "eval"), _namespace())
        except Exception as exc:
            results[case_id] = {
                "type": type(exc).__name__,
                "mro": [cls.__name__ for cls in type(exc).__mro__],
                "message": str(exc),
            }
        else:
            results[case_id] = {"returned": repr(value)[:500]}
        finally:
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old
        outcome = results[case_id]
        print(f"{case_id}: " + (f"{outcome['type']}: {outcome['message']}" if "type" in outcome else "no error"))
    return results


def main() -> None:
    step, cases_file = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(cases_file).read_text())
    if step == "setup":
        _setup(spec)
    elif step == "run":
        Path(sys.argv[3]).write_text(json.dumps(_run(spec), indent=1))
    else:
        raise SystemExit(f"unknown step {step!r}: expected setup or run")


if __name__ == "__main__":
    main()
