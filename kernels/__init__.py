"""Triton kernels (paged and contiguous decode attention, KV store) and their PyTorch references.

One module per kernel (decode and extend attention, the split-KV merge, the KV store, fused
Llama ops), each checked against `reference.py`; the addressing they read is the allocators'
(`engines.allocator.Extent` and `BlockTable`). docs/KERNELS.md describes them.
"""
