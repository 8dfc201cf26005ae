"""``x-estimate MODEL --plan``: the cheapest training settings that fit N GPUs of a given memory.

``search`` ranks the settings from their simulated steps (``Plan``, ``PlanRow``, ``Setting``);
``report`` prints a plan as a table or JSON, with how to run its cheapest row; ``config`` writes
that row as the launch config x-launch runs (``--write-config``).
"""
