"""What a tensor-parallel degree must divide, checked before any process is started.

Torch-free, so configuration checks can use it without importing the model code.
"""

from __future__ import annotations

from kvbench.errors import KvbenchError
from kvbench.models import ModelSpec


def check_tensor_parallel(spec: ModelSpec, size: int) -> None:
    """Raise a one-line error unless `spec` splits evenly across `size` ranks.

    Each rank holds whole attention heads (and whole KV heads: its slice of the arena), and an
    equal share of the MLP's inner width, so all three must divide by `size`.
    """
    if size < 1:
        raise KvbenchError(f"--tensor-parallel must be a positive integer, got {size}")
    if spec.num_heads % size or spec.num_kv_heads % size:
        raise KvbenchError(
            f"--tensor-parallel {size}: {spec.name} has {spec.num_heads} attention heads and "
            f"{spec.num_kv_heads} KV heads; both must divide by {size}"
        )
    if spec.ffn % size:
        raise KvbenchError(
            f"--tensor-parallel {size}: {spec.name}'s MLP width {spec.ffn} does not divide by {size}"
        )
