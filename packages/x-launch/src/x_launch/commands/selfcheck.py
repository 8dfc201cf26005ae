"""The distributed self-check that ``x-launch test`` runs in every launched process.

    python selfcheck.py REPORT_DIR      (started by x-launch test under the configured launch)

Each process runs the checks in order and writes what it found to ``REPORT_DIR/rank<N>.json``
(ranks never share a pipe, so lines cannot interleave); ``x-launch test`` reads the files and
prints one line per check. A check that fails stops the later ones on that process, since
they depend on it. Collectives run with a short timeout so a broken setup fails instead of hanging.
"""

from __future__ import annotations

import json
import socket
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

TIMEOUT = timedelta(seconds=60)


class CheckFailed(Exception):
    """A check found a wrong value; the message says which and where."""


def expected_sum(world: int) -> int:
    """What ``all_reduce(SUM)`` of ``rank + 1`` over ``world`` processes must give."""
    return world * (world + 1) // 2


def check_layout(infos: list[dict[str, Any]], world: int) -> str:
    """Ranks 0..world-1 once each, local ranks unique per host, devices not shared.

    Raises:
        CheckFailed: naming the ranks that disagree.
    """
    ranks = sorted(info["rank"] for info in infos)
    if ranks != list(range(world)):
        raise CheckFailed(f"ranks {ranks} are not 0..{world - 1} once each")
    per_host: dict[str, list[dict[str, Any]]] = {}
    for info in infos:
        per_host.setdefault(info["host"], []).append(info)
    for host, members in per_host.items():
        local = sorted(m["local_rank"] for m in members)
        if local != list(range(len(members))):
            raise CheckFailed(f"local ranks on {host} are {local}, expected 0..{len(members) - 1}")
        if any(m["local_world_size"] != len(members) for m in members):
            raise CheckFailed(f"LOCAL_WORLD_SIZE on {host} disagrees with the {len(members)} processes there")
        devices = [m["device"] for m in members if m["device"] != "cpu"]
        if len(devices) != len(set(devices)):
            raise CheckFailed(f"processes on {host} share a device: {sorted(devices)}")
    hosts = ", ".join(f"{host}: {len(members)}" for host, members in sorted(per_host.items()))
    return f"{world} ranks, {len(per_host)} host(s) ({hosts})"


# How far 3 SGD steps on 2+ processes may land from the same steps on one, by mixed precision.
PARITY_TOLERANCE = {"no": 1e-5, "fp16": 2.0**-10, "bf16": 2.0**-8}


class SelfCheck:
    """The checks of one process, in order."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        from x_common import env
        from x_common.process_env import process_env

        self.torch, self.dist = torch, dist
        where = process_env()
        self.rank, self.world = where.rank, where.world_size
        self.local_rank, self.local_world = where.local_rank, where.local_world_size
        use_cpu = bool(env.USE_CPU.read())
        self.device = (
            torch.device("cuda", self.local_rank) if torch.cuda.is_available() and not use_cpu else torch.device("cpu")
        )
        self.results: list[dict[str, Any]] = []

    def run(self, name: str, check: Callable[[], str]) -> bool:
        try:
            detail = check()
        except CheckFailed as exc:
            self.results.append({"name": name, "ok": False, "detail": f"rank {self.rank}: {exc}"})
            return False
        except Exception as exc:  # a crash is a failed check, reported with where it happened
            where = traceback.extract_tb(exc.__traceback__)[-1]
            text = f"rank {self.rank}: {type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"
            self.results.append({"name": name, "ok": False, "detail": text})
            return False
        self.results.append({"name": name, "ok": True, "detail": detail})
        return True

    def rendezvous(self) -> str:
        if self.world == 1:
            return "one process: nothing to join"
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            self.torch.cuda.set_device(self.device)
        self.dist.init_process_group(backend, timeout=TIMEOUT)
        if self.dist.get_world_size() != self.world or self.dist.get_rank() != self.rank:
            raise CheckFailed(
                f"process group says rank {self.dist.get_rank()} of {self.dist.get_world_size()}, "
                f"environment says {self.rank} of {self.world}"
            )
        return f"{self.world} processes joined over {backend}"

    def _all_infos(self) -> list[dict[str, Any]]:
        info = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world,
            "host": socket.gethostname(),
            "device": str(self.device),
        }
        if self.world == 1:
            return [info]
        gathered: list[Any] = [None] * self.world
        self.dist.all_gather_object(gathered, info)
        return gathered

    def layout(self) -> str:
        return check_layout(self._all_infos(), self.world)

    def device_check(self) -> str:
        tensor = self.torch.ones(4, device=self.device) * (self.rank + 1)
        if tensor.sum().item() != 4 * (self.rank + 1):
            raise CheckFailed(f"arithmetic on {self.device} gave {tensor.sum().item()}")
        return f"every rank computes on its device ({self.device.type})"

    def all_reduce(self) -> str:
        value = self.torch.tensor([float(self.rank + 1)], device=self.device)
        if self.world > 1:
            self.dist.all_reduce(value)
        if value.item() != expected_sum(self.world):
            raise CheckFailed(f"all_reduce(sum of rank+1) gave {value.item():g}, expected {expected_sum(self.world)}")
        return f"sum of rank+1 = {expected_sum(self.world)}"

    def broadcast(self) -> str:
        source = self.world - 1
        value = self.torch.tensor([float(self.rank * 10 + 7)], device=self.device)
        if self.world > 1:
            self.dist.broadcast(value, src=source)
        if value.item() != source * 10 + 7:
            raise CheckFailed(f"broadcast from rank {source} gave {value.item():g}, expected {source * 10 + 7}")
        return f"value of rank {source} reached every rank"

    def all_gather(self) -> str:
        mine = self.torch.tensor([self.rank, self.rank * self.rank], device=self.device)
        parts = [self.torch.zeros_like(mine) for _ in range(self.world)]
        if self.world > 1:
            self.dist.all_gather(parts, mine)
        else:
            parts = [mine]
        got = [p.tolist() for p in parts]
        expected = [[r, r * r] for r in range(self.world)]
        if got != expected:
            raise CheckFailed(f"all_gather gave {got}, expected {expected}")
        return "every rank's tensor, in rank order"

    def runtime(self) -> str:
        from x_runtime import Accelerator

        accelerator = Accelerator(cpu=self.device.type == "cpu")
        if (accelerator.process_index, accelerator.num_processes) != (self.rank, self.world):
            raise CheckFailed(
                f"Accelerator sees process {accelerator.process_index} of {accelerator.num_processes}, "
                f"torch.distributed {self.rank} of {self.world}"
            )
        self._sharding(accelerator)
        precision = self._training_parity(accelerator)
        return f"Accelerator: ranks, data sharding, gather_for_metrics, training parity (mixed_precision {precision})"

    def _sharding(self, accelerator: Any) -> None:
        from torch.utils.data import DataLoader

        size = 3 * self.world + 1  # never divides evenly: padding must be dropped again
        # A list is a map-style dataset to torch, which types the argument as Dataset only.
        loader = accelerator.prepare(DataLoader(list(range(size)), batch_size=2))  # type: ignore[arg-type]
        gathered: list[int] = []
        mine: list[int] = []
        for batch in loader:
            mine.extend(batch.tolist())
            gathered.extend(accelerator.gather_for_metrics(batch).tolist())
        if gathered != list(range(size)):
            raise CheckFailed(f"gather_for_metrics over {size} samples gave {gathered}")
        everyone = accelerator.gather(self.torch.tensor([len(mine)])).tolist()
        if len(set(everyone)) != 1:
            raise CheckFailed(f"ranks got different numbers of samples: {everyone}")

    def _training_parity(self, accelerator: Any) -> str:
        torch = self.torch
        generator = torch.Generator().manual_seed(0)
        x, y = torch.randn(8 * self.world, 3, generator=generator), torch.randn(8 * self.world, 1, generator=generator)

        def fresh() -> Any:
            torch.manual_seed(1)
            return torch.nn.Linear(3, 1)

        reference = fresh()
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        for _ in range(3):
            with accelerator.autocast():  # one process under the configured precision
                loss = torch.nn.functional.mse_loss(reference(x), y)
            loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
        model = fresh()
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        share = slice(8 * self.rank, 8 * (self.rank + 1))
        for _ in range(3):
            inputs, targets = x[share].to(accelerator.device), y[share].to(accelerator.device)
            accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
        trained = accelerator.unwrap_model(model).weight.detach().cpu()
        difference = (trained - reference.weight.detach()).abs().max().item()
        precision = str(accelerator.mixed_precision)
        # Each rank's gradient of its half batch is rounded to the precision's 16 bits before the ranks
        # average them, one process's once: about one unit in the last place of the weights (|w| < 1).
        tolerance = PARITY_TOLERANCE.get(precision, PARITY_TOLERANCE["bf16"])
        if difference > tolerance:
            raise CheckFailed(
                f"{self.world}-process training differs from 1 process by {difference:.3g} under mixed_precision "
                f"{precision} (its tolerance: {tolerance:.3g})"
            )
        return precision

    def checks(self) -> list[tuple[str, Callable[[], str]]]:
        found = [
            ("rendezvous", self.rendezvous),
            ("rank layout", self.layout),
            ("device", self.device_check),
            ("all_reduce", self.all_reduce),
            ("broadcast", self.broadcast),
            ("all_gather", self.all_gather),
        ]
        import importlib.util

        if importlib.util.find_spec("x_runtime") is not None:
            found.append(("x-runtime", self.runtime))
        return found


def main(report_dir: str) -> int:
    check = SelfCheck()
    for name, step in check.checks():
        if not check.run(name, step):
            break
    folder = Path(report_dir)
    tmp = folder / f".rank{check.rank}.json.partial"
    tmp.write_text(json.dumps({"rank": check.rank, "world": check.world, "results": check.results}))
    tmp.replace(folder / f"rank{check.rank}.json")
    if check.dist.is_initialized():
        check.dist.destroy_process_group()
    return 0 if all(result["ok"] for result in check.results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
