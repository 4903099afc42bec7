"""Triton kernels (paged and contiguous decode attention, KV store) and their PyTorch references.

Empty in the foundation: engines are simulated with a cost model until the real-decoding
and kernels issues land. The addressing the kernels will read is already fixed by the
allocators (`engines.allocator.Extent` and `BlockTable`).
"""
