"""Training memory by running the step: the model's own class, on fake tensors, under a ledger.

``step`` runs one training step (forward, loss, backward, optimizer step) and holds its figures
(``SimulatedStep``); the step's batch and loss come from ``inputs``, its allocations are counted
by ``ledger``, fixed up where fake kernels differ from real ones (``fake_kernels``) and where
convolution kernels hold more than their outputs (``convolutions``). ``layer_extrapolation``
simulates a few blocks of a deep stack and extrapolates the rest; ``rows`` decides which rows are
simulated and runs them; ``cache`` keeps the results on disk; ``error`` is the one error a
simulation raises. Import the modules themselves: this package imports nothing, so torch loads
only when a simulation runs.
"""
