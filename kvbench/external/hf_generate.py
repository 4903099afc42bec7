"""hf-generate: transformers' `generate` on padded request-level batches, the static-batching anchor.

What most users run first, done the way they would do it:

1. Take the requests in arrival order, `--hf-batch-size` at a time. A batch starts once its last
   request has arrived and the previous batch has finished (an idle gap is jumped over).
2. Left-pad the prompts to the longest (attention mask 0 on the padding; Llama and OPT derive
   their positions from the mask, so a padded prompt computes what it computes alone).
3. `generate(max_new_tokens = the longest output in the batch)`, EOS disabled (the model's
   `eos_token_id` is cleared), greedy at temperature 0, else transformers' own sampling.
4. Each request keeps its first `output_len` tokens; its token times are the steps' times, taken
   by a streamer when each step's tokens reach the host, so TTFT and TPOT are per token, not the
   batch's end. A request that finished early still holds its row until the batch ends.

steps.csv gets one row per forward pass (prefill or decode): time, batch size, tokens fed
(padding included), waiting and running requests; the occupancy columns are empty (transformers'
dynamic cache is not observable as kvbench's categories).
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from kvbench.config import Prepared, RunConfig
from kvbench.engine import StepRecord
from kvbench.errors import KvbenchError
from kvbench.external.common import peak_memory, reset_peak_memory, set_up
from kvbench.external.observed import Observed, RunClock, build_result
from kvbench.external.options import base_attention
from kvbench.gc_pause import gc_paused
from kvbench.requests import Request
from kvbench.simulate import RunResult

PAD = 0  # any id: padded positions are masked out


class StepTimes:
    """A `generate` streamer that notes when each step's tokens reach the host, on the run's clock.

    `generate` calls `put` once with the prompt, then once per step with the new tokens (already
    copied to the host, so the step has finished on the device)."""

    def __init__(self, clock: RunClock) -> None:
        self.clock = clock
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.times.append(self.clock.now())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def left_padded(prompts: list[np.ndarray], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask `[B, longest prompt]`, prompts right-aligned."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), PAD, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def run_generate(config: RunConfig, prepared: Prepared | None = None) -> RunResult:
    setup = set_up(config, prepared, base_attention(config.hf_attn))
    prepared, model, device = setup.prepared, setup.model, setup.device
    requests, prompts = prepared.trace.requests, setup.prompts()
    arrivals = np.array([r.arrival_s for r in requests])  # (N,) sorted
    size = config.hf_batch_size
    sampling = {"do_sample": True, "temperature": config.temperature, "top_k": 0, "top_p": 1.0}
    options = sampling if config.temperature > 0 else {"do_sample": False}
    observed: list[Observed] = []
    steps: list[StepRecord] = []
    reset_peak_memory(device)
    clock = RunClock()
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.inference_mode(), torch.random.fork_rng(devices=forked), gc_paused(collect=True):
        torch.manual_seed(config.weights_seed)
        for first in range(0, len(requests), size):
            batch = requests[first : first + size]
            clock.jump_to(batch[-1].arrival_s)  # its requests have arrived; the previous batch is done
            start = clock.now()
            ids, mask = left_padded(prompts[first : first + size], device)
            longest = max(r.output_len for r in batch)
            streamer = StepTimes(clock)
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=longest, pad_token_id=PAD,
                streamer=streamer, use_cache=True, **options,
            )  # fmt: skip
            tokens = out[:, ids.shape[1] :].tolist()  # [B][longest]
            times = np.array(streamer.times)  # (longest,)
            if len(times) != longest or any(len(row) != longest for row in tokens):
                raise KvbenchError(
                    f"--engine hf-generate: transformers generated {len(times)} of {longest} tokens "
                    "(EOS or another stopping rule was not disabled)"
                )
            end = float(times[-1])
            observed += [
                Observed(r, start, end, times[: r.output_len], row[: r.output_len])
                for r, row in zip(batch, tokens, strict=True)
            ]
            steps += _rows(batch, start, times, ids.shape[1], arrivals, first, len(steps))
    extra = setup.summary() | peak_memory(device) | {"hf_batch_size": size}
    return build_result(prepared, observed, steps=tuple(steps), extra=extra)


def _rows(
    batch: tuple[Request, ...], start: float, times: np.ndarray, width: int, arrivals: np.ndarray,
    first: int, step: int,
) -> list[StepRecord]:  # fmt: skip
    """One steps.csv row per forward pass of a batch (`width`: the padded prompt length); what
    is not observed (the occupancy columns) stays empty."""
    ends = times.tolist()
    rows = []
    for k, (s, e) in enumerate(zip([start, *ends[:-1]], ends, strict=True)):
        known = {
            "step": step + k, "num_steps": 1, "start_s": s, "duration_s": e - s,
            "kind": "decode" if k else "prefill", "batch_size": len(batch),
            "num_tokens": len(batch) * (1 if k else width),  # padding included: it is computed
            "context_tokens": len(batch) * (width + k),  # every row attends over the padded width
            "swapped_blocks": 0, "num_preempted": 0, "num_swapped": 0, "num_running": len(batch),
            "num_waiting": max(0, int(np.searchsorted(arrivals, s, side="right")) - first - len(batch)),
        }  # fmt: skip
        rows.append(StepRecord(**{f.name: known.get(f.name) for f in fields(StepRecord)}))
    return rows
