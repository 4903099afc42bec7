"""The virtual KV arena of a real `vmm` run, shaped by the allocator the run's engine builds."""

from __future__ import annotations

import torch

from engines import get_engine
from kvbench.config import Prepared
from kvbench.modeling.virtual_arena import VirtualKVArena


def open_vmm_arena(prepared: Prepared, dtype: torch.dtype, device: torch.device) -> VirtualKVArena:
    """Ranges and pages as the run's `VirtualAllocator` will have them (the options build the
    same one again in the run), under the configured layout."""
    allocator = get_engine("vmm").build(prepared.options).allocator
    return VirtualKVArena.for_allocator(prepared.model, allocator, prepared.config.vmm_layout, dtype, device)
