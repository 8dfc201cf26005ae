"""x's strengths inside the libraries that drive their own loop: transformers' ``Trainer`` (``transformers``).

Imported on its own (``from x_runtime.integrations.transformers import PreemptionCallback``): it
needs transformers, which x-runtime does not depend on.
"""
