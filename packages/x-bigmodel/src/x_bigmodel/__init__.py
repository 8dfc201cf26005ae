"""x-bigmodel: load and run models bigger than GPU memory or RAM, spread over GPU, CPU and disk."""

from x_bigmodel._version import __version__

__all__ = ["__version__"]
