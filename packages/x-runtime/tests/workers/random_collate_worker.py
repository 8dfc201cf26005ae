"""A run whose ``collate_fn`` draws from the global RNG (noise, as a masking collator does).

    random_collate_worker.py OUT CKPT full|resume stateful|skip [x|accelerate]

``full`` trains one epoch of 8 batches and saves after the 5th; ``resume`` is a new process that
``load_state``s that save and trains the rest. Both write the final weights. The model has dropout:
any draw moved between the collator and the model shows.
"""

from __future__ import annotations

import sys

import torch
from _helpers import report
from torch.utils.data import DataLoader, TensorDataset

out, ckpt, mode, path = sys.argv[1:5]
lib = sys.argv[5] if len(sys.argv) > 5 else "x"
if lib == "x":
    from x_runtime import Accelerator, DataLoaderConfiguration, set_seed, skip_first_batches
else:
    from accelerate import Accelerator, DataLoaderConfiguration, skip_first_batches
    from accelerate.utils import set_seed

SAVE_AFTER = 5


def noisy(samples):
    inputs = torch.stack([s[0] for s in samples])
    targets = torch.stack([s[1] for s in samples])
    return inputs + torch.randn_like(inputs), targets


accelerator = Accelerator(
    cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=path == "stateful")
)
set_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
loader = DataLoader(data, batch_size=4, shuffle=True, collate_fn=noisy)
net, opt, loader = accelerator.prepare(net, opt, loader)
if mode == "resume":
    accelerator.load_state(ckpt)
    if path == "skip":
        loader = skip_first_batches(loader, SAVE_AFTER)
step = SAVE_AFTER if mode == "resume" else 0
for inputs, targets in loader:
    loss = torch.nn.functional.mse_loss(net(inputs), targets)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    step += 1
    if mode == "full" and step == SAVE_AFTER:
        accelerator.save_state(ckpt)
report({"steps": step, "weights": [p.detach().flatten().tolist() for p in net.parameters()]}, out)
