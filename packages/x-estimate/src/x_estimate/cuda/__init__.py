"""What a CUDA GPU adds to a step simulated on the CPU: its kernels, workspaces and allocator.

``kernels`` picks the kernels a CUDA step would run (attention, dropout, autocast's casts) for
fake tensors that stay on the CPU; ``step`` adds cuBLAS workspaces and 512-byte blocks to the
simulated step and replays it per device; ``caching_allocator`` models PyTorch's CUDA caching
allocator, which gives the Reserved figure. Nothing here imports the rest of x-estimate.
"""
