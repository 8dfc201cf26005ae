"""x-runtime: the ``Accelerator`` that runs one training script on CPU, many GPUs, many machines or TPU."""

from x_runtime._version import __version__

__all__ = ["__version__"]
