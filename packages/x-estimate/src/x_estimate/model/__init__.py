"""What is being estimated: the model, from where its config comes to what it holds.

Where MODEL comes from (``source``), the checks its config passes (``config_checks``), the model
built on the meta device (``skeleton``) and reduced to plain data (``summary``, cached on disk by
``cache``), and what that data says without running a step: the KV cache (``kv_layout``,
``inference``), the units a device map keeps whole (``layers``) and the quantized sizes
(``quantized``). ``errors`` holds the one error the estimator reports to the user. The modules
are imported one by one, never from here, so a command line that has not yet parsed its
arguments imports no torch.
"""
