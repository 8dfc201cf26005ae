"""The prepared optimizer and scheduler: they step on accumulation boundaries only.

``optimizer`` (``AcceleratedOptimizer``: through the fp16 scaler, with the strategy's
before/after-step hooks) and ``scheduler`` (``AcceleratedScheduler``: advances when the
optimizer really stepped).
"""

from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler"]
