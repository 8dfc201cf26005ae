"""Shared by worker scripts: write this rank's findings where the test reads them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def report(data: dict, out_dir: str | None = None) -> None:
    """Write ``data`` as JSON to ``<out_dir>/rank<RANK>.json`` (out_dir defaults to argv[1])."""
    folder = Path(out_dir or sys.argv[1])
    tmp = folder / f".rank{rank()}.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(folder / f"rank{rank()}.json")


class Counter:
    """Micro-steps taken, saved and restored with the checkpoint (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]
