"""CUDA virtual memory for KV caches: a virtually contiguous range whose physical pages are
mapped as it grows (the vAttention approach), so contiguous attention kernels need no block
table and the addresses a CUDA graph captured never move.

`driver` binds the CUDA driver's virtual-memory calls through ctypes (no compilation, no extra
package); it is imported only by code that runs on a GPU.
"""
