"""How much memory a model's forward passes take beyond weights and KV, measured on the device.

An emulated GPU's KV budget is its memory minus what a server holds besides the arena. The
weights are measured as loaded; the activations are measured here by running the two largest
steps the run can schedule, on the real model, against a scratch arena:

- a prefill of `max_num_batched_tokens` tokens (sequences of the model's maximum length), and
- a decode step of `max_num_seqs` sequences, sampled at the run's temperature (logits and
  sampling noise are `[B, vocab]` each),

taking the larger peak of allocated memory above what was allocated before (the scratch arena
excluded). On CPU there is no allocator to ask; the caller keeps the estimate.
"""

from __future__ import annotations

import torch

from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.sampling import sample
from kvbench.real.model_runner import pad_prefill


@torch.inference_mode()
def measure_activation_bytes(
    model: CausalLM, device: torch.device, *, tokens: int, max_seqs: int, backend: str, temperature: float
) -> int:
    """Peak bytes of the largest prefill and decode steps beyond weights and KV (CUDA only)."""
    spec = model.spec
    dtype = next(model.parameters()).dtype
    torch.cuda.synchronize(device)
    scratch = KVArena(spec, tokens, dtype, device)  # [L, tokens, Hkv, D] x 2
    before = torch.cuda.memory_allocated(device)
    peaks = []
    lengths = [min(spec.max_len, tokens - start) for start in range(0, tokens, spec.max_len)]
    decode = [1] * min(max_seqs, tokens)
    for is_prefill, lens in ((True, lengths), (False, decode)):
        torch.cuda.reset_peak_memory_stats(device)
        counts = torch.tensor(lens, device=device)  # [B]
        cu = torch.nn.functional.pad(counts.cumsum(0), (1, 0))  # [B + 1]
        total = int(cu[-1])
        positions = torch.arange(total, device=device) - cu[:-1].repeat_interleave(counts)  # [T]
        ids, slots = torch.zeros(total, dtype=torch.int64, device=device), torch.arange(total, device=device)
        if is_prefill:  # as the runner pads them: [T + pad] each
            ids, positions, slots = pad_prefill(ids, positions, slots)
        meta = AttentionMetadata(
            is_prefill, slots, cu, counts.to(torch.int32),
            starts=cu[:-1], max_new=max(lens), num_splits=1, backend=backend,
        )  # fmt: skip
        logits = model(ids, positions, meta, scratch)  # [B, V]
        sample(logits, temperature, 0, torch.arange(len(lens), device=device), positions[cu[1:] - 1])
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - before)
        del logits
    del scratch
    torch.cuda.empty_cache()
    return max(peaks)
