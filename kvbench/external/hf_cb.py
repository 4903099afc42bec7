"""hf-cb: transformers' continuous batching, fed each request at its arrival time.

transformers (>= 5.17) serves requests on a background thread: `model.init_continuous_batching`
makes a manager with a paged KV cache and a FIFO scheduler; `add_request(input_ids,
max_new_tokens=..., record_timestamps=True)` queues one; `get_result` hands back finished ones,
with a `perf_counter` timestamp per generated token. `generate_batch` would be simpler but takes
every request at once, so it cannot honour arrival times. The loop here:

1. Build the model with kvbench's weights, sized like kvbench's engines: the cache holds the run's
   KV budget (`num_blocks` = budget slots // block size) unless `--hf-memory` asks for a share of
   free GPU memory instead; `max_batch_tokens` and `max_requests_per_batch` are kvbench's
   scheduler caps (`--max-num-batched-tokens`, `--max-num-seqs`). Warm up (CUDA graphs), start.
2. Feed: add every request whose arrival time has come (the run's clock); wait for results until
   the next arrival; when nothing is in flight, jump the clock to the next arrival.
3. Each finished request must have exactly its output length (EOS disabled, per-request
   `max_new_tokens`), or the run stops with an error naming the transformers version.

transformers' API moved between 5.17 and 5.24 (`block_size` became `page_size`; "paged|sdpa"
became "sdpa" with `auto_switch_to_flash=False`); `cb_api` finds which one is installed.
From 5.24 OPT's forward takes the paged cache as `cache` and asks it for a sequence length it
has no method for; `_cache_length_hook` answers 0 (the manager passes every position itself).
Preemptions, scheduler steps and the cache's occupancy are inside transformers: requests.csv
leaves `num_preemptions` empty and steps.csv has no rows.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, fields

import numpy as np
import torch

from kvbench.config import Prepared, RunConfig, batched_tokens
from kvbench.errors import KvbenchError
from kvbench.external.common import peak_memory, reset_peak_memory, set_up
from kvbench.external.hf_weights import transformers_module
from kvbench.external.observed import Observed, RunClock, build_result
from kvbench.external.options import base_attention
from kvbench.gc_pause import gc_paused
from kvbench.requests import Request
from kvbench.simulate import RunResult

NEEDS = "--engine hf-cb needs transformers >= 5.17 (continuous batching with per-request max_new_tokens)"
_ADD_REQUEST = ("input_ids", "request_id", "max_new_tokens", "record_timestamps", "eos_token_id")


@dataclass(frozen=True)
class CbApi:
    """Where the installed transformers keeps what hf-cb needs."""

    config_class: type  # ContinuousBatchingConfig
    block_field: str  # "page_size" (>= 5.18) or "block_size" (5.17)
    pins_attention: bool  # has `auto_switch_to_flash` (else the "paged|" prefix keeps the kernel)
    version: str

    def default_block_size(self) -> int:
        return next(f.default for f in fields(self.config_class) if f.name == self.block_field)

    def attention(self, base: str) -> str:
        """The attn_implementation to load the model with, so the manager runs kernel `base`."""
        if self.pins_attention:
            return "paged|eager" if base == "eager" else base
        return f"paged|{base}"


def cb_api(tf) -> CbApi:
    """Check the installed transformers (`tf`, a module) for the continuous-batching API hf-cb uses."""
    version = getattr(tf, "__version__", "?")
    manager = getattr(tf, "ContinuousBatchingManager", None)
    mixin = getattr(tf, "ContinuousMixin", None)
    config_class = getattr(getattr(tf, "generation", None), "ContinuousBatchingConfig", None)
    if manager is None or mixin is None or config_class is None:
        raise KvbenchError(f"{NEEDS}; transformers {version} has no continuous batching manager")
    missing = [name for name in ("init_continuous_batching",) if not callable(getattr(mixin, name, None))] + [
        name
        for name in ("add_request", "get_result", "start", "stop")
        if not callable(getattr(manager, name, None))
    ]
    if missing:
        raise KvbenchError(f"{NEEDS}; transformers {version} lacks {', '.join(missing)}")
    accepted = inspect.signature(manager.add_request).parameters
    lacking = [name for name in _ADD_REQUEST if name not in accepted]
    if lacking:
        raise KvbenchError(f"{NEEDS}; transformers {version}'s add_request takes no {', '.join(lacking)}")
    names = {f.name for f in fields(config_class)}
    block = next((name for name in ("page_size", "block_size") if name in names), None)
    if block is None or not {"num_blocks", "max_memory_percent", "max_batch_tokens"} <= names:
        raise KvbenchError(
            f"{NEEDS}; transformers {version}'s ContinuousBatchingConfig lacks the cache sizes"
        )
    return CbApi(config_class, block, "auto_switch_to_flash" in names, version)


def run_cb(config: RunConfig, prepared: Prepared | None = None) -> RunResult:
    tf = transformers_module()
    api = cb_api(tf)
    setup = set_up(config, prepared, api.attention(base_attention(config.hf_attn)))
    prepared, model, device = setup.prepared, setup.model, setup.device
    requests = prepared.trace.requests
    block = config.hf_block_size or api.default_block_size()
    sizes = {
        api.block_field: block,
        "max_batch_tokens": batched_tokens(config, prepared.model),
        "max_requests_per_batch": config.max_num_seqs or 256,
    }
    if config.hf_memory is not None:
        sizes["max_memory_percent"] = config.hf_memory
    else:  # the same KV budget as kvbench's engines
        sizes["num_blocks"] = max(1, prepared.budget.num_slots // block)
    if api.pins_attention:
        sizes["auto_switch_to_flash"] = False
    sampling = {"do_sample": True, "temperature": config.temperature, "top_k": 0, "top_p": 1.0}
    generation = tf.GenerationConfig(
        max_new_tokens=max(r.output_len for r in requests), eos_token_id=-1, pad_token_id=0,
        **(sampling if config.temperature > 0 else {"do_sample": False}),
    )  # fmt: skip
    forked = [device.index or 0] if device.type == "cuda" else []
    # no_grad, not inference_mode: 5.17's loop thread updates the cache in place outside inference mode
    with torch.no_grad(), torch.random.fork_rng(devices=forked):
        torch.manual_seed(config.weights_seed)  # transformers' sampling draws from torch's generator
        manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=api.config_class(**sizes)
        )
        hook = model.register_forward_pre_hook(_cache_length_hook, with_kwargs=True)
        started = False  # an unstarted manager's stop only logs warnings beside a refusal's one line
        try:
            reset_peak_memory(device)
            try:
                warmup_s = _warm_up(manager)
            except (MemoryError, torch.OutOfMemoryError) as error:
                raise KvbenchError(
                    f"--engine hf-cb: transformers' KV cache does not fit ({str(error).strip()[:120]}); "
                    + _cache_hint(device)
                ) from None
            except ValueError as error:
                raise _sizing_error(config, error) from None
            with gc_paused(collect=True):  # as kvbench's own engines run (kvbench.gc_pause)
                started = True  # before start(): one that fails half way is stopped too
                manager.start()
                observed = _feed(manager, requests, setup.prompts())
            cache = getattr(manager.batch_processor, "cache", None)
            num_blocks = getattr(cache, "num_blocks", sizes.get("num_blocks"))
        finally:
            if started:
                manager.stop(block=True)
            hook.remove()
    extra = setup.summary() | peak_memory(device)
    extra |= {"hf_block_size": block, "hf_num_blocks": num_blocks, "hf_memory": config.hf_memory,
              "hf_max_batch_tokens": sizes["max_batch_tokens"], "hf_warmup_s": warmup_s}  # fmt: skip
    num_slots = num_blocks * block if num_blocks else None
    source = f"--hf-memory {config.hf_memory}" if config.hf_memory else prepared.budget.source
    return build_result(
        prepared, observed, num_slots=num_slots, kv_source=f"transformers cache sized by {source}",
        preemptions_observed=False, extra=extra,
    )  # fmt: skip


def _sizing_error(config: RunConfig, error: ValueError) -> Exception:
    """transformers' refusal of the cache it sized, as the flag that sized it; any other
    ValueError as it was. A --hf-memory fraction that passes kvbench's (0, 1] can still leave
    transformers no room for one block of the batch (`Invalid values: ..., num_sectors = -8`),
    which only its own sizing, from the memory it finds free, can tell."""
    if "Invalid values" not in str(error):
        return error
    flag = f"--hf-memory {config.hf_memory:g}" if config.hf_memory is not None else "--kv-cache-gib"
    return KvbenchError(
        f"{flag}: transformers finds no room for its KV cache in it ({str(error).strip()[:80]}); give more"
    )


def _cache_hint(device: torch.device) -> str:
    """What to do about a cache that does not fit. On the CPU, transformers 5.17 reads the host's
    memory through psutil and, without it, takes 0 bytes to be available, whatever the budget."""
    if device.type == "cpu" and importlib.util.find_spec("psutil") is None:
        return "transformers reads the host's memory through psutil, not installed: pip install psutil"
    return "lower --kv-cache-gib or give --hf-memory"


def _cache_length_hook(module, args: tuple, kwargs: dict) -> None:
    """Give the paged cache a `get_seq_length` where it has none (transformers 5.24's OPT).

    OPT's forward calls `cache.get_seq_length()` for the length already cached, which only
    matters when no positions are given; continuous batching always gives them (one flat row
    of many requests' tokens, so no single length would be right anyway). Answering 0 leaves
    the positions the manager passed untouched. Set on the run's own cache object only.
    """
    cache = kwargs.get("cache")
    if cache is not None and not hasattr(cache, "get_seq_length"):
        cache.get_seq_length = _no_cached_length


def _no_cached_length(layer_idx: int = 0) -> int:
    return 0


def _warm_up(manager) -> float:
    """Capture transformers' CUDA graphs before the clock starts (kvbench's runner does the same)."""
    if not callable(getattr(manager, "warmup", None)):
        return 0.0
    clock = RunClock()
    manager.warmup()
    return clock.now()


def _feed(manager, requests: tuple[Request, ...], prompts: list[np.ndarray]) -> list[Observed]:
    """Add each request at its arrival time on the run's clock; collect every result."""
    clock = RunClock()
    pending = list(zip(requests, prompts, strict=True))[::-1]  # next arrival last
    in_flight: dict[str, tuple[Request, float]] = {}  # id -> request, clock offset when added
    observed: list[Observed] = []
    while pending or in_flight:
        if not in_flight and pending:
            clock.jump_to(pending[-1][0].arrival_s)  # idle: skip to the next arrival
        while pending and pending[-1][0].arrival_s <= clock.now():
            request, prompt = pending.pop()
            key = f"r{request.request_id}"
            added = manager.add_request(
                prompt.tolist(), request_id=key, max_new_tokens=request.output_len, record_timestamps=True,
                eos_token_id=-1,
            )  # fmt: skip
            if added is None:
                raise KvbenchError(f"--engine hf-cb: transformers refused request {request.request_id}")
            in_flight[key] = (request, clock.offset)
        wait = pending[-1][0].arrival_s - clock.now() if pending else 1.0
        result = manager.get_result(timeout=max(wait, 1e-4))
        if result is None:
            if not manager.is_running():
                raise KvbenchError(
                    f"--engine hf-cb: transformers' continuous batching stopped with {len(in_flight)} "
                    "requests unfinished (its log above says why)"
                )
            continue
        if not result.is_finished() or result.request_id not in in_flight:
            continue
        request, offset = in_flight.pop(result.request_id)
        observed.append(_observed(result, request, offset, clock))
    return observed


def _observed(result, request: Request, offset: float, clock: RunClock) -> Observed:
    """A finished transformers result on the run's clock, checked for its exact output length."""
    if result.error is not None:
        first = str(result.error).strip().splitlines()[0] if str(result.error).strip() else "unknown error"
        version = transformers_module().__version__
        raise KvbenchError(
            f"--engine hf-cb: transformers {version} failed request {request.request_id}: {first}"
        )
    tokens, stamps = list(result.generated_tokens), result.timestamps or []
    if len(tokens) != request.output_len or len(stamps) != request.output_len:
        raise KvbenchError(
            f"--engine hf-cb: transformers {transformers_module().__version__} returned {len(tokens)} tokens "
            f"({len(stamps)} timestamps) for request {request.request_id}, which asked for exactly "
            f"{request.output_len}; per-request max_new_tokens is not honoured by this version"
        )
    times = np.array([clock.of(t, offset) for t in stamps])  # (output_len,)
    started = result.lifespan[0]
    admitted = clock.of(started, offset) if started > 0 else float(times[0])
    return Observed(request, min(admitted, float(times[0])), float(times[-1]), times, tokens)
