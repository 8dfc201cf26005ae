"""Every core of a TPU host trains one replica (``nox -s tests_tpu`` on a TPU VM).

Kept apart from test_xla.py, whose tests start the XLA runtime in the pytest process on the CPU:
here the pytest process must not touch the TPU, which the launched processes claim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from x_common import env

WORKERS = Path(__file__).parent / "workers"


@pytest.mark.requires_tpu
def test_every_tpu_core_trains_one_replica_with_averaged_gradients(tmp_path: Path) -> None:
    x_launch = Path(sys.executable).with_name("x-launch")
    result = subprocess.run(
        [str(x_launch), "--tpu", str(WORKERS / "xla_worker.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, env.PJRT_DEVICE.name: "TPU"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    world = len(reports)
    assert world > 1 and all(r["world"] == world for r in reports)
    # Replicas start equal and see different batches; averaged gradients keep their weights equal.
    assert all(r["weights"] == reports[0]["weights"] for r in reports)
    assert all(r["gathered_ranks"] == list(range(world)) for r in reports)
    assert all(r["rank_sum"] == world * (world - 1) / 2 for r in reports)
    assert all(r["objects"] == [f"rank{i}" for i in range(world)] for r in reports)
