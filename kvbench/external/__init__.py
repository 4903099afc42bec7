"""External engines: Hugging Face transformers' own serving loops, run side by side with kvbench's.

They are anchors, not allocator x scheduler pairs: the same trace, the same weights and the same
result files, but transformers owns the KV cache and the batching, so kvbench can only watch from
outside (token times, output ids, torch memory). Real runs only; see docs/EXTERNAL.md.

| engine        | what runs                                                              |
|---------------|------------------------------------------------------------------------|
| hf-generate   | `model.generate` on left-padded batches of `--hf-batch-size` requests  |
| hf-cb         | transformers' continuous batching manager, requests added on arrival   |

This module is imported by `kvbench.config`, so it stays light: torch and transformers are
imported only when an engine runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.errors import KvbenchError

if TYPE_CHECKING:
    from kvbench.config import Prepared, RunConfig
    from kvbench.simulate import RunResult

# --hf-attn: transformers attention implementations its continuous batching accepts (each behind
# its paged cache); hf-generate runs the same kernel without the "paged|" prefix
HF_ATTN = ("paged|sdpa", "paged|eager", "paged|flash_attention_2", "paged|flash_attention_3")


def _run_generate(config: RunConfig, prepared: Prepared | None) -> RunResult:
    from kvbench.external.hf_generate import run_generate

    return run_generate(config, prepared)


def _run_cb(config: RunConfig, prepared: Prepared | None) -> RunResult:
    from kvbench.external.hf_cb import run_cb

    return run_cb(config, prepared)


@dataclass(frozen=True)
class ExternalEngine:
    name: str
    summary: str  # one line for --help and reports
    run: Callable[[RunConfig, Prepared | None], RunResult]


EXTERNAL: dict[str, ExternalEngine] = {
    e.name: e
    for e in (
        ExternalEngine(
            "hf-generate",
            "transformers generate: padded request-level batches (static batching)",
            _run_generate,
        ),
        ExternalEngine("hf-cb", "transformers continuous batching (its paged cache and scheduler)", _run_cb),
    )
}


def is_external(engine: str) -> bool:
    return engine in EXTERNAL


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
