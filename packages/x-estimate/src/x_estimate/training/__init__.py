"""Training memory by formula, and a row's training peak with what it is made of.

``memory`` sums weights, gradients, optimizer state and the fp32 master copy per parameter,
with what ZeRO/FSDP divide; ``peak`` turns a simulated step or those formulas into the peak a
row reports, and the bytes of a gathered unit under sharding.
"""
