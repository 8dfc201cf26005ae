"""Loading a checkpoint into a (possibly meta-device) model, one tensor at a time, as a ``DevicePlan`` says.

``load_plan`` works out what will be read from the headers alone, ``checkpoint`` streams the
tensors (``load_checkpoint_in_model``, ``set_module_tensor_to_device``), ``progress`` draws the bar
and ``readahead`` warms the page cache for mapped CPU weights after the load.
"""
