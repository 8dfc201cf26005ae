"""Running a model spread over devices: hooks around each module's forward, and the public entry points.

``hooks`` holds Accelerate's hook API (``ModelHook``, ``add_hook_to_module``); ``align_hook`` the
hook that moves inputs and brings offloaded weights in; ``hook_attach`` decides which modules get
which hook; ``tensor_sources`` where each placed tensor's value comes from; ``planned`` places a
model as a ``DevicePlan`` says. The entry points: ``entry_points`` (``dispatch_model``,
``load_checkpoint_and_dispatch``), ``whole_model`` (``cpu_offload``, ``disk_offload``) and
``offload_hook`` (``cpu_offload_with_hook``); ``layerwise_casting`` keeps layers in a small dtype
between their forwards (``attach_layerwise_casting_hooks``).
"""
