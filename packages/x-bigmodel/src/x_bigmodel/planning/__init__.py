"""Planning where a model's weights go, before any weight is read.

``empty_weights`` builds the skeleton on the meta device, ``model_units`` cuts it into placement
units with their sizes, ``budgets`` and ``balanced_memory`` say how much each device may hold,
``auto_map`` fills GPUs, then CPU, then disk, and ``device_map`` resolves what the user wrote into
the one ``DevicePlan`` (``device_plan``) the loader and the dispatcher both read.
"""
