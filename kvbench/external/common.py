"""What both external engines do around the run: resolve the device, load the model, read memory."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from kvbench.config import Prepared, RunConfig, prepare
from kvbench.external.hf_weights import load_hf_model, transformers_module
from kvbench.real.model_runner import prompt_token_ids
from kvbench.real.run import resolve_device, resolve_dtype
from workloads.columns import check_vocabulary


@dataclass(frozen=True)
class Setup:
    prepared: Prepared
    device: torch.device
    dtype: torch.dtype
    model: torch.nn.Module  # transformers' model
    load_s: float  # seconds to build (or load) it

    def prompts(self) -> list[np.ndarray]:
        """Each request's prompt ids, exactly those kvbench's engines feed (trace order)."""
        seed, vocab = self.prepared.config.weights_seed, self.prepared.model.vocab
        return [prompt_token_ids(r, vocab, seed) for r in self.prepared.trace.requests]

    def summary(self) -> dict:
        """summary.json keys every real run has, as far as they apply to an external engine."""
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "weight_bytes": sum(p.nbytes for p in self.model.parameters()),
            "attention": self.model.config._attn_implementation,
            "transformers_version": transformers_module().__version__,
            "model_load_s": self.load_s,
        }


def set_up(config: RunConfig, prepared: Prepared | None, attn_implementation: str) -> Setup:
    """Validate the config, then build transformers' model with kvbench's weights on the device."""
    prepared = prepared or prepare(config)
    check_vocabulary(prepared.trace, prepared.model.vocab, config.model)  # as kvbench's engines do
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    start = time.perf_counter()
    model = load_hf_model(config.model, config.weights_seed, dtype, device, attn_implementation)
    return Setup(prepared, device, dtype, model, time.perf_counter() - start)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict:
    """The CUDA caching allocator's peaks since `reset_peak_memory` (the torch collector's keys);
    nothing on the CPU, where torch keeps no such count."""
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    return {
        "torch_peak_allocated_bytes": stats.get("allocated_bytes.all.peak", 0),
        "torch_peak_reserved_bytes": stats.get("reserved_bytes.all.peak", 0),
        "torch_alloc_retries": stats.get("num_alloc_retries", 0),
        "torch_ooms": stats.get("num_ooms", 0),
    }
