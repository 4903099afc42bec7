"""The external engines' own flags (`--hf-*`), checked before anything heavy is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbench.errors import KvbenchError

if TYPE_CHECKING:
    from kvbench.config import RunConfig

# --hf-attn: transformers attention implementations its continuous batching accepts (each behind
# its paged cache); hf-generate runs the same kernel without the "paged|" prefix
HF_ATTN = ("paged|sdpa", "paged|eager", "paged|flash_attention_2", "paged|flash_attention_3")


def base_attention(name: str) -> str:
    """`--hf-attn` (with or without the `paged|` prefix) -> the kernel name (`sdpa`, `eager`, ...)."""
    base = name.removeprefix("paged|")
    if f"paged|{base}" not in HF_ATTN:
        raise KvbenchError(f"unknown --hf-attn {name!r}; choose one of: {', '.join(HF_ATTN)}")
    return base


def check_options(config: RunConfig) -> None:
    """Refuse bad external-engine flags with one line naming the flag."""
    base_attention(config.hf_attn)
    if config.hf_batch_size < 1:
        raise KvbenchError(f"--hf-batch-size must be a positive integer, got {config.hf_batch_size}")
    if config.hf_block_size is not None and config.hf_block_size < 4:
        raise KvbenchError(
            f"--hf-block-size must be an integer >= 4 (transformers' minimum), got {config.hf_block_size}"
        )
    if config.hf_memory is not None and not 0 < config.hf_memory <= 1:
        raise KvbenchError(f"--hf-memory must be a fraction in (0, 1], got {config.hf_memory}")
