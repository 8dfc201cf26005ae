"""Devices and single tensors: the keys a device map names devices by, and putting one tensor into a module.

The bottom layer of x-bigmodel: ``device_keys`` (``0``, ``"cpu"``, ``"disk"`` and the torch devices
they mean), ``tensor_placement`` (a tensor set into a module on a device, in a dtype, ties kept),
``device_moves`` (a forward's inputs and outputs moved between devices) and ``pages`` (``madvise``).
"""
