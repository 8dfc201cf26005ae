"""Data: prepared (sharded, resumable) loaders and the samplers under them.

``loader`` is the prepared loader: how it is built (``prepare_data_loader``, ``skip_first_batches``,
the ``LoaderSpec`` strategies build from) and the two prepared classes; ``loader_state``
what they show as Accelerate's (``DataLoaderStateMixin``, the stateful look); ``skip_loader`` and
``iterable_shard`` are Accelerate's ``SkipDataLoader`` and ``IterableDatasetShard``; ``samplers``
and ``steps`` deal indices and batches out to the ranks as one ``Sharding`` says;
``gradient_state`` is where loaders report the end of an epoch to the
optimizer, scheduler and ``gather_for_metrics`` (it lives here because the loaders feed it).
``send_to_device`` (``core.nested``) is re-exported.
"""

from x_runtime.core.nested import send_to_device
from x_runtime.data.gradient_state import GradientState
from x_runtime.data.iterable_shard import IterableDatasetShard
from x_runtime.data.loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    LoaderSpec,
    prepare_data_loader,
    prepare_sharded_loader,
    skip_first_batches,
)
from x_runtime.data.loader_state import DataLoaderStateMixin, StatefulLook
from x_runtime.data.samplers import BatchSamplerShard, SeedableRandomSampler, SkipBatchSampler, check_split
from x_runtime.data.sharding import Sharding
from x_runtime.data.skip_loader import SkipDataLoader
from x_runtime.data.steps import BatchOps, global_steps, rank_batch_count

__all__ = [
    "BatchOps",
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "GradientState",
    "IterableDatasetShard",
    "LoaderSpec",
    "SeedableRandomSampler",
    "Sharding",
    "SkipBatchSampler",
    "SkipDataLoader",
    "StatefulLook",
    "check_split",
    "global_steps",
    "prepare_data_loader",
    "prepare_sharded_loader",
    "rank_batch_count",
    "send_to_device",
    "skip_first_batches",
]
