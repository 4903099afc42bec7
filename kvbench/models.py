"""Model presets: real architecture numbers, for sizing the KV arena and the cost model.

Each preset is the public config.json of its model written in (the source named beside it);
what is derived from it (KV bytes per token and per layer group, parameter counts) is computed
by `ModelSpec` (kvbench/kvspec/model.py) and pinned by tests against the model cards. OPT and
Llama presets are decoded by kvbench's own model code.
"""

from __future__ import annotations

from kvbench.errors import KvbenchError
from kvbench.kvspec.model import ModelSpec

__all__ = ["MODELS", "ModelSpec", "get_model"]


def _opt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, "opt", layers, hidden, heads, heads, 4 * hidden, 50272, 2048)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _opt("opt-125m", 12, 768, 12),
        _opt("opt-1.3b", 24, 2048, 32),
        _opt("opt-2.7b", 32, 2560, 32),
        _opt("opt-6.7b", 32, 4096, 32),
        _opt("opt-13b", 40, 5120, 40),
        _opt("opt-66b", 64, 9216, 72),
        _opt("opt-175b", 96, 12288, 96),
        ModelSpec("llama-13b", "llama", 40, 5120, 40, 40, 13824, 32000, 2048, norm_eps=1e-6),
        # the reference workload's model (benchmarks/real_decode.py; about 1.2 B parameters)
        ModelSpec("llama-1b-ref", "llama", 16, 2048, 32, 8, 8192, 32000, 2048),
        # tiny configurations for CPU tests and smoke runs (random weights only)
        ModelSpec("tiny-opt", "opt", 2, 64, 4, 4, 256, 512, 2048),
        ModelSpec("tiny-llama", "llama", 2, 64, 4, 2, 128, 512, 2048),
        ModelSpec("llama-3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000.0),
    )
}  # fmt: skip


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KvbenchError(f"unknown --model {name!r}; choose one of: {', '.join(MODELS)}") from None
