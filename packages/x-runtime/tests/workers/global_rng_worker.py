"""``prepare`` a shuffled (or not) ``DataLoader(range(8), batch_size=4)`` with the default settings
after ``torch.manual_seed(0)``, iterate two epochs, then draw once from the global RNG.

    global_rng_worker.py OUT

Writes, per rank, the batches and the next draw for shuffle on and off.
"""

from __future__ import annotations

import torch
from _helpers import report
from torch.utils.data import DataLoader

from x_runtime import Accelerator

found = {}
for shuffle in (True, False):
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(range(8), batch_size=4, shuffle=shuffle))
    epochs = [[batch.tolist() for batch in loader] for _ in range(2)]
    found[str(shuffle)] = {"epochs": epochs, "next": torch.rand(1).item()}
report(found)
