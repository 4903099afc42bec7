"""External engines: Hugging Face transformers' own serving loops, run side by side with kvbench's.

They are anchors, not allocator x scheduler pairs: the same trace, the same weights and the same
result files, but transformers owns the KV cache and the batching, so kvbench can only watch from
outside (token times, output ids, torch memory). Real runs only; see docs/EXTERNAL.md.

| engine        | what runs                                                              |
|---------------|------------------------------------------------------------------------|
| hf-generate   | `model.generate` on left-padded batches of `--hf-batch-size` requests  |
| hf-cb         | transformers' continuous batching manager, requests added on arrival   |

The package `kvbench` imports this module to register the engines (`kvbench.plugins`), so it
stays light: torch and transformers are imported only when an engine runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbench.external.options import check_options
from kvbench.plugins import ExternalEngine, register

if TYPE_CHECKING:
    from kvbench.config import Prepared, RunConfig
    from kvbench.simulate import RunResult


def _run_generate(config: RunConfig, prepared: Prepared | None) -> RunResult:
    from kvbench.external.hf_generate import run_generate

    return run_generate(config, prepared)


def _run_cb(config: RunConfig, prepared: Prepared | None) -> RunResult:
    from kvbench.external.hf_cb import run_cb

    return run_cb(config, prepared)


register(
    ExternalEngine(
        "hf-generate",
        "transformers generate: padded request-level batches (static batching)",
        _run_generate,
        check_options,
    )
)
register(
    ExternalEngine(
        "hf-cb", "transformers continuous batching (its paged cache and scheduler)", _run_cb, check_options
    )
)
