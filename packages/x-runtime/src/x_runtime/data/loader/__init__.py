"""The prepared loader: a user's ``DataLoader`` rebuilt so each rank yields its share of every global step.

``prepare`` builds one (``prepare_data_loader``, ``prepare_sharded_loader``, ``skip_first_batches``
and the ``LoaderSpec`` strategies build from); ``loaders`` holds what it builds: the
``PreparedLoader`` base (epochs, position, checkpoint state, knowing the last batch ahead) and its
two kinds, ``DataLoaderShard`` (every process reads its share) and ``DataLoaderDispatcher`` (the
main process reads and sends).
"""

from x_runtime.data.loader.loaders import DataLoaderDispatcher, DataLoaderShard, PreparedLoader
from x_runtime.data.loader.prepare import LoaderSpec, prepare_data_loader, prepare_sharded_loader, skip_first_batches

__all__ = [
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "LoaderSpec",
    "PreparedLoader",
    "prepare_data_loader",
    "prepare_sharded_loader",
    "skip_first_batches",
]
