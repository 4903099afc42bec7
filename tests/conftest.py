"""Without a GPU, Triton kernels run in Triton's interpreter (on CPU tensors).

The switch must be set before any kernel module is imported: `triton.jit` reads it when it
decorates a kernel.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
