"""x-estimate: how much memory a model needs to load and to train, from its config alone."""

from x_estimate._version import __version__

__all__ = ["__version__"]
