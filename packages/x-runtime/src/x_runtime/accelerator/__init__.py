"""The facade: ``Accelerator`` and Accelerate's state views, over the layers below.

``facade`` holds the class and ``__init__``; its methods come from one module per concern
(``prepare``, ``step``, ``processes``, ``checkpoints``, ``tracking``, ``ddp``, ``profile``,
``preemption``), each a mixin over the fields ``fields.AcceleratorFields`` declares once.
``state_views`` gives ``PartialState``/``AcceleratorState``/``GradientState`` as views over one
accelerator's own process state.
"""

from x_runtime.accelerator.facade import Accelerator

__all__ = ["Accelerator"]
