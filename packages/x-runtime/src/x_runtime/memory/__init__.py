"""Memory checked against the plan while the run runs: the step's measured peak beside x-estimate's.

``guard`` is the concept (what the run says, when); ``measure`` reads a step's real peak;
``simulation`` asks x-estimate, in a process beside the run, for the step's planned one.
"""
