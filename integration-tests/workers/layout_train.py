"""Train a tiny transformers Llama under the layout the launcher or the code names; report what came out.

    python layout_train.py OUT [--steps N] [--from-step K] [--save DIR] [--load DIR]
                               [--layout dp_replicate,dp_shard,tp] [--precisions no,bf16] [--user-plan] [--split]

The global batch is 8 sequences whatever the layout: each data parallel rank reads 8 / dp of
them from a prepared loader (not shuffled), so one process and every layout see the same
batches. ``--layout`` passes ``ParallelismConfig`` in code; without it the launcher's
``PARALLELISM_CONFIG_*`` variables (``ACCELERATE_USE_PARALLELISM_CONFIG``) name the layout.
``--load`` resumes a ``save_state`` folder (any layout) and trains to ``--steps``. For each of
``--precisions`` (``no,bf16``: one Accelerator after another in the same processes) rank 0 writes
``OUT/<precision>/weights.safetensors`` (``get_state_dict``: whole tensors) and ``report.json``
(losses, the gathered evaluation ids, the layout) and, with ``--save``, the state after training.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from x_runtime import Accelerator, DataLoaderConfiguration, ParallelismConfig
from x_runtime.core.parallel_handlers import TorchTensorParallelConfig

GLOBAL_BATCH = 8
MAX_STEPS = 4  # the data: the same at every --steps, so a resumed run reads on where the saved one stopped
EVAL_SAMPLES = 13  # not a multiple of any data parallel size: the last batch is evened out


class Stream(torch.utils.data.IterableDataset):
    """Read once, on rank 0: prepared loaders dispatch an iterable dataset's batches to every rank."""

    def __iter__(self):
        return iter(range(EVAL_SAMPLES))


def tiny_llama(tied: bool = False) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--load", type=Path)
    parser.add_argument("--layout", help="dp_replicate,dp_shard,tp[,cp] sizes given in code (cp: GPUs only)")
    parser.add_argument("--precisions", default="no", help="comma-separated: one Accelerator after another")
    parser.add_argument("--tied", action="store_true", help="the head shares the embedding's weight")
    parser.add_argument("--user-plan", action="store_true", help="the plan given in code, not the model's")
    parser.add_argument(
        "--split", action="store_true", help="split_batches: the loader yields the global batch, each dp rank its slice"
    )
    args = parser.parse_args()
    accelerator = None
    for precision in args.precisions.split(","):
        accelerator = train_once(args, precision, args.out / precision)
    assert accelerator is not None
    accelerator.end_training()


def train_once(args: argparse.Namespace, precision: str, out: Path) -> Accelerator:
    config = None
    if args.layout:
        replicate, shard, tp, cp = ([int(n) for n in args.layout.split(",")] + [1])[:4]
        handler = None
        if args.user_plan:
            plan = {
                "model.layers.*.self_attn.q_proj": "colwise",
                "model.layers.*.self_attn.k_proj": "colwise",
                "model.layers.*.self_attn.v_proj": "colwise",
                "model.layers.*.self_attn.o_proj": "rowwise",
                "model.layers.*.mlp.gate_proj": "colwise",
                "model.layers.*.mlp.up_proj": "colwise",
                "model.layers.*.mlp.down_proj": "rowwise",
            }
            handler = TorchTensorParallelConfig(plan=plan)
        config = ParallelismConfig(
            dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp, cp_size=cp, tp_handler=handler
        )
    accelerator = Accelerator(
        parallelism_config=config,
        mixed_precision=precision,
        # Stateful: load_state resumes at the next batch (at any layout: the split loader is the same everywhere).
        dataloader_config=DataLoaderConfiguration(split_batches=args.split, use_stateful_dataloader=True),
    )
    pc = accelerator.parallelism_config
    dp = pc.data_parallel_size if pc is not None else accelerator.num_processes

    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (GLOBAL_BATCH * MAX_STEPS, 16), generator=generator)
    model = tiny_llama(args.tied)
    # lr 1e-4: every weight moves ~3e-4 in 3 steps, 30x the 1e-5 the layouts must agree to; at 1e-3 AdamW
    # turns last-bit differences of a near-zero gradient (another summation order) into 1e-5 steps.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # Split: the same loader at every layout, so a resumed run counts the same batches.
    train = DataLoader(list(tokens), batch_size=GLOBAL_BATCH if args.split else GLOBAL_BATCH // dp)
    evaluate = DataLoader(list(range(EVAL_SAMPLES)), batch_size=4 if args.split else 2)
    stream = DataLoader(Stream(), batch_size=4 if args.split else 2)
    model, optimizer, train, evaluate, stream = accelerator.prepare(model, optimizer, train, evaluate, stream)
    done = 0
    if args.load:
        accelerator.load_state(str(args.load))
        done = len(json.loads((args.load / "steps.json").read_text()))

    losses = []
    model.train()
    for batch in train if done < args.steps else []:
        # Labels shifted before the sequence is split over context parallel ranks (the model's own shift
        # would cross the ranks' boundaries); without context parallelism the block does nothing.
        shifted = torch.nn.functional.pad(batch[:, 1:], (0, 1), value=-100)
        positions = torch.arange(batch.shape[1], device=batch.device).expand_as(batch).contiguous()
        buffers = [batch, shifted, positions]
        with accelerator.maybe_context_parallel(
            buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)
        ):
            loss = model(input_ids=batch, labels=batch, shift_labels=shifted, position_ids=positions).loss
            accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
        if done + len(losses) == args.steps:
            break  # before the loader yields (and counts) a batch this run does not train on
    seen = []
    for ids in evaluate:
        seen.extend(accelerator.gather_for_metrics(ids).tolist())
    streamed = []
    for ids in stream:
        streamed.extend(accelerator.gather_for_metrics(ids).tolist())
    # gather and reduce keep Accelerate's meaning: every rank's value, tensor parallel ranks included.
    if pc is not None:
        rank = accelerator.data_parallel_rank * pc.dp_shard_size + accelerator.data_parallel_shard_rank
    else:
        rank = accelerator.process_index
    counted = accelerator.reduce(torch.tensor(1.0), "sum").item()
    gathered = accelerator.gather(torch.tensor([rank])).tolist()

    if args.save:
        accelerator.save_state(str(args.save))
        if accelerator.is_main_process:
            (args.save / "steps.json").write_text(json.dumps(list(range(done + len(losses)))))
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.float().clone() for k, v in weights.items()}, str(out / "weights.safetensors"))
        report = {
            "losses": losses,
            "eval_ids": seen,
            "stream_ids": streamed,
            "distributed_type": str(accelerator.distributed_type),
            "dp": dp,
            "mesh": list(accelerator.torch_device_mesh.mesh_dim_names) if accelerator.torch_device_mesh else None,
            "tp_rank": accelerator.tensor_parallel_rank if pc is not None else None,
            "counted": counted,
            "gathered": gathered,
            "sizes": pc.to_json() if pc is not None else None,
        }
        (out / "report.json").write_text(json.dumps(report, default=str))
    return accelerator


if __name__ == "__main__":
    main()
