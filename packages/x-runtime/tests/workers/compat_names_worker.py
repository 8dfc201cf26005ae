"""Accelerate's names on 2 real processes: state views, join, sync trigger, comm hooks, LocalSGD,
profiling, and FSDP save -> merge -> load. Writes what it saw to rank<N>.json."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from _helpers import rank, report
from torch.utils.data import DataLoader, TensorDataset

from x_runtime import (
    Accelerator,
    AcceleratorState,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    FullyShardedDataParallelPlugin,
    LocalSGD,
    PartialState,
    ProfileKwargs,
    load_fsdp_model,
    merge_fsdp_weights,
    save_fsdp_model,
)

out = Path(sys.argv[1])
found: dict = {}

# --- state views ---------------------------------------------------------------------------
partial = PartialState()  # standalone: reads torchrun's variables, joins the group
accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
state = accelerator.state
found["partial"] = [partial.process_index, partial.num_processes, partial.local_process_index, partial.is_main_process]
found["state"] = [state.process_index, state.num_processes, state.is_last_process, state.use_distributed]
found["type_is_multi_cpu"] = state.distributed_type == DistributedType.MULTI_CPU
found["standalone_state_type"] = AcceleratorState().distributed_type
found["repr_head"] = repr(partial).splitlines()[:2]
with partial.split_between_processes([1, 2, 3]) as share:
    found["share"] = share
found["main_only"] = partial.on_main_process(lambda: "ran")()
partial.wait_for_everyone()

# --- join_uneven_inputs: rank 0 has 2 batches, rank 1 has 1, DDP does not hang ---------------
model = accelerator.prepare(torch.nn.Linear(1, 1))
loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(3.0).unsqueeze(1)), batch_size=1))
seen = []
with accelerator.join_uneven_inputs([model]):
    for index, (batch,) in enumerate(loader):
        model(batch).sum().backward()
        seen.append(index)
found["joined_batches"] = seen
even = Accelerator(cpu=True)
even_model = even.prepare(torch.nn.Linear(1, 1))
even_loader = even.prepare(DataLoader(TensorDataset(torch.arange(3.0)), batch_size=1))
with even.join_uneven_inputs([even_model], even_batches=False):
    found["overridden"] = even_loader.batch_sampler.even_batches
found["restored"] = even_loader.batch_sampler.even_batches
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    even.state.distributed_type = DistributedType.FSDP
    with even.join_uneven_inputs([even_model]):
        pass
    even.state.distributed_type = DistributedType.MULTI_CPU
found["non_ddp_warning"] = [str(w.message) for w in caught]
found["other_accelerator_unchanged"] = accelerator.state.distributed_type

# --- trigger_sync_in_backward: gradients all-reduced inside no_sync -------------------------
torch.manual_seed(0)
net = even.prepare(torch.nn.Linear(2, 1, bias=False))
x = torch.full((1, 2), float(rank() + 1))
with even.no_sync(net):
    net(x).sum().backward()
found["grad_no_sync"] = net.module.weight.grad.tolist()
net.zero_grad()
with even.no_sync(net), even.trigger_sync_in_backward(net):
    net(x).sum().backward()
found["grad_triggered"] = net.module.weight.grad.tolist()

# --- DDP communication hook -------------------------------------------------------------------
hooked = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)])
torch.manual_seed(0)
hooked_net = hooked.prepare(torch.nn.Linear(2, 1, bias=False))
hooked_net(x).sum().backward()
found["hooked_grad"] = hooked_net.module.weight.grad.tolist()
found["hook_registered"] = hooked_net._comm_hooks != [] if hasattr(hooked_net, "_comm_hooks") else None

# --- LocalSGD: parameters differ between averagings, agree after -----------------------------
local = Accelerator(cpu=True)
torch.manual_seed(0)
local_net = local.prepare(torch.nn.Linear(2, 1, bias=False))
optimizer = local.prepare(torch.optim.SGD(local_net.parameters(), lr=0.1))
with LocalSGD(local, local_net, local_sgd_steps=2) as local_sgd:
    for step in range(2):
        local_net(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:
            found["local_after_1"] = local_net.module.weight.detach().tolist()
        local_sgd.step()
found["local_after_2"] = local_net.module.weight.detach().tolist()

# --- profile ----------------------------------------------------------------------------------
with local.profile(ProfileKwargs(output_trace_dir=str(out / "traces"))):
    local_net(x)
found["trace"] = (out / "traces" / f"profile_{rank()}.json").exists()

# --- FSDP: save_fsdp_model -> merge_fsdp_weights -> load_fsdp_model ----------------------------
plugin = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")
sharded = Accelerator(cpu=True, fsdp_plugin=plugin)
found["fsdp_type"] = sharded.state.distributed_type
found["first_type_after_fsdp"] = accelerator.state.distributed_type
torch.manual_seed(0)
tiny = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
expected = {k: v.clone() for k, v in tiny.state_dict().items()}
tiny = sharded.prepare(tiny)
save_fsdp_model(plugin, sharded, tiny, out / "ckpt")
sharded.wait_for_everyone()
found["shards"] = sorted(p.name for p in (out / "ckpt" / "pytorch_model_fsdp_0").iterdir())
merge_fsdp_weights(out / "ckpt" / "pytorch_model_fsdp_0", out / "merged")
merge_fsdp_weights(out / "ckpt" / "pytorch_model_fsdp_0", out / "merged", safe_serialization=False)
if rank() == 0:
    from safetensors.torch import load_file

    merged = load_file(out / "merged" / "model.safetensors")
    binary = torch.load(out / "merged" / "pytorch_model.bin", weights_only=True)
    found["merged_equal"] = sorted(merged) == sorted(expected) and all(
        torch.equal(merged[k], expected[k]) and torch.equal(binary[k], expected[k]) for k in expected
    )
with torch.no_grad():
    for param in tiny.parameters():
        param.zero_()
load_fsdp_model(plugin, sharded, tiny, out / "ckpt")
full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in tiny.state_dict().items()}
found["loaded_equal"] = all(torch.equal(full[k], expected[k]) for k in expected)
report(found)
