"""One rank of a SLURM integration test: a gloo all_reduce, then this rank's view of the job.

    python slurm_rank.py OUT_DIR [--accelerator]

Writes OUT_DIR/rank<R>.json (one file per rank: ranks on several "nodes" must not share a pipe).
With --accelerator the process group comes from x_runtime.Accelerator, which reads the ranks the
launcher set; otherwise plain torch.distributed with init_process_group("gloo").
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

SEEN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "X_LAUNCHED",
    "X_DISTRIBUTED_TYPE",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NODEID",
    "SLURMD_NODENAME",
)


def main() -> None:
    out_dir = Path(sys.argv[1])
    if "--accelerator" in sys.argv[2:]:
        from x_runtime import Accelerator

        accelerator = Accelerator(cpu=True)
        rank, world = accelerator.process_index, accelerator.num_processes
        local = accelerator.local_process_index
        total = accelerator.reduce(torch.tensor([rank + 1.0]), reduction="sum").item()
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
        tensor = torch.tensor([rank + 1.0])
        dist.all_reduce(tensor)
        total = tensor.item()
    record = {"rank": rank, "world": world, "local_rank": local, "sum": total, "pid": os.getpid()}
    record["env"] = {name: os.environ.get(name) for name in SEEN}
    tmp = out_dir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(out_dir / f"rank{rank}.json")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
