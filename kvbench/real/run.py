"""The run job: the same engines on real decoding, with measured step times.

The model (a preset with seeded random weights, or a local checkpoint) and the KV arena are
built once on the device; every engine's allocator carves that arena, and `ModelRunner` feeds
each scheduled batch through the model. Results have the same files as a simulation. With
`--tensor-parallel N` the model and arena are split over N processes (`kvbench.parallel`);
this process is rank 0 and the budget, slots and results stay the whole model's.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engines import get_engine
from engines.hybrid import group_shapes
from kvbench.budget import check_device_memory
from kvbench.config import Prepared, RunConfig, batched_tokens, prepare, resolve_model
from kvbench.cost_model import KvReads
from kvbench.errors import KvbenchError
from kvbench.gc_pause import gc_paused
from kvbench.modeling.attention import BACKENDS, resolve_backend
from kvbench.modeling.mla import set_expert_dispatch
from kvbench.modeling.virtual_arena import VirtualKVArena
from kvbench.parallel.session import Session, open_session
from kvbench.parallel.sizes import check_tensor_parallel
from kvbench.plugins import EXTERNAL
from kvbench.real.activations import measure_activation_bytes
from kvbench.real.collectors import CollectingRunner, build_collectors, parse_collectors, routed_expert_bytes
from kvbench.real.grouped_arena import GroupedKVArena
from kvbench.real.vmm_arena import open_vmm_arena
from kvbench.simulate import RunResult, execute
from workloads.columns import check_vocabulary

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise KvbenchError(f"--device {name!r} is not a device (cpu, cuda, cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise KvbenchError(f"--device {name}: no CUDA device is available here")
        if (device.index or 0) >= torch.cuda.device_count():
            raise KvbenchError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise KvbenchError(f"--device {name}: only cpu and cuda are supported")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise KvbenchError(f"unknown --dtype {name!r}; choose one of: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def grouped_arena(
    prepared: Prepared, session: Session, dtype: torch.dtype, device: torch.device
) -> GroupedKVArena | None:
    """`hybrid` and `jenga` on a model of several KV groups: one buffer of their pool's bytes with
    a view per layer (`kvbench.real.grouped_arena`); None for every other engine and model, whose
    arena is `KVArena` (a single group's pool is paged's blocks: the same arena)."""
    allocator = get_engine(prepared.config.engine).allocator(prepared.options)
    if not hasattr(allocator, "memory_layout") or len(allocator.shapes) < 2:
        return None
    if session.size > 1:
        raise KvbenchError(
            f"--engine {prepared.config.engine}: a table per KV group is decoded on one device; "
            "drop --tensor-parallel"
        )
    return GroupedKVArena.for_allocator(prepared.model, allocator, dtype, device)


def run_real(
    config: RunConfig,
    *,
    prepared: Prepared | None = None,
    coalesce: bool = True,
    session: Session | None = None,
) -> RunResult:
    """Run the config's trace through its engine with real forward passes on `config.device`.

    `session`: an open one holding `config.model` (several runs share one tensor-parallel
    group); by default the model is built for this run alone.
    """
    if config.engine in EXTERNAL:  # transformers' own loops (kvbench/external/)
        return EXTERNAL[config.engine].run(config, prepared)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if config.attention not in BACKENDS:
        raise KvbenchError(f"--attention {config.attention!r}: choose one of {', '.join(BACKENDS)}")
    collect = parse_collectors(config.collectors)
    spec = resolve_model(config.model)
    if config.engine == "vmm" and spec.mla is not None:  # the simulated pages hold the latent
        raise KvbenchError(
            f"--engine vmm --model {config.model}: the real virtual arena keeps K and V per head, not an "
            "MLA latent; `kvbench simulate` sizes vmm pages by the latent"
        )
    if spec.moe is None and config.expert_dispatch != "dense":
        raise KvbenchError(f"--expert-dispatch {config.expert_dispatch}: {config.model} has no experts")
    if session is None:
        check_tensor_parallel(spec, config.tensor_parallel)
        with open_session(
            config.model, spec, tensor_parallel=config.tensor_parallel, dtype=dtype, device=device,
            seed=config.weights_seed,
        ) as opened:  # fmt: skip
            return run_real(config, prepared=prepared, coalesce=coalesce, session=opened)
    if session.size != config.tensor_parallel or session.model.spec != spec:  # a caller's bug
        raise ValueError(
            f"the session holds {session.model.spec.name} on {session.size} ranks, not this run's"
        )
    model = session.model
    if spec.moe is not None:  # a session's model serves every run of a sweep: set for each
        set_expert_dispatch(model, config.expert_dispatch)
    weight_bytes = session.weight_bytes  # every rank's, tied parameters once
    activation_bytes = None
    if device.type == "cuda" and session.size == 1 and config.kv_cache_gib is None and prepared is None:
        activation_bytes = measure_activation_bytes(
            model, device, tokens=batched_tokens(config, spec), max_seqs=config.max_num_seqs or 256,
            backend=resolve_backend(config.attention, device), temperature=config.temperature,
        )  # fmt: skip
    bandwidth = None
    if device.type == "cuda" and "roofline" in collect:  # before the arena takes the memory it reads
        from kernels.bandwidth import measure_read_bandwidth

        bandwidth = measure_read_bandwidth(device)
    # an emulated GPU's budget subtracts the weights as loaded (dtype included) and the
    # activations as measured
    prepared = prepared or prepare(config, weight_bytes=weight_bytes, activation_bytes=activation_bytes)
    check_vocabulary(prepared.trace, spec.vocab, config.model)  # before any step: ids the model can embed
    check_device_memory(prepared.budget, device, session.size)  # before allocating, not by OOM
    try:
        arena = (  # vmm: virtual ranges whose pages the runner maps as the allocator holds them
            open_vmm_arena(prepared, dtype, device) if config.engine == "vmm"
            else grouped_arena(prepared, session, dtype, device) or session.arena(prepared.budget.num_slots)
        )  # fmt: skip
    except torch.OutOfMemoryError:
        raise KvbenchError(
            f"the KV arena of {prepared.budget.num_slots} slots does not fit on {device} "
            "beside the weights; lower --kv-cache-gib"
        ) from None

    trace = prepared.trace.requests
    max_len = max(request.kv_len for request in trace) + 1
    # every parallel sample and every beam is a row of a decode batch: buffers (and CUDA graphs)
    # sized by requests alone would regrow, dropping the graphs, the first time a group forks
    rows = sum(max(request.n, request.beam_width) for request in trace)
    max_batch = min(rows, prepared.options.scheduler.max_num_seqs or rows)
    # beam steps rank candidates by their logits: graphs keep theirs (one [rows, V] per bucket)
    beams = any(request.beam_width > 1 for request in trace)
    runners = []

    def make_runner(scheduler):
        try:  # the runner captures its CUDA graphs now, in what the arena left
            runner = session.runner(
                arena, scheduler.allocator, max_batch=max_batch, max_len=max_len,
                temperature=config.temperature, seed=config.weights_seed, attention=config.attention,
                cuda_graphs=config.cuda_graphs, keep_logits=beams, vmm_map=config.vmm_map,
                prefill_graphs=config.prefill_graphs,
            )  # fmt: skip
        except torch.OutOfMemoryError:
            graphs = "decode and prefill graphs" if config.prefill_graphs else "decode graphs"
            raise KvbenchError(
                f"the {graphs} do not fit on {device} beside the weights and the KV arena; "
                "lower --kv-cache-gib" + (" or drop --prefill-graphs" if config.prefill_graphs else "")
            ) from None
        routed, picked = routed_expert_bytes(spec, config.expert_dispatch, weight_bytes)
        collectors = build_collectors(  # they see rank 0's GPU: its share of weights and K/V
            collect, device=device, weight_bytes=weight_bytes // session.size,
            kv_bytes_per_token=spec.kv_bytes_per_token // session.size, read_bandwidth=bandwidth,
            reads=KvReads.of(group_shapes(spec.groups)), routed_bytes=routed // session.size,
            expert_pick=picked,
        )  # fmt: skip
        runners.append(CollectingRunner(runner, collectors))
        return runners[-1]

    try:
        with gc_paused(collect=True):  # no collector pause inside a timed step (kvbench.gc_pause)
            result = execute(config, make_runner, mode="real", coalesce=coalesce, prepared=prepared)
    finally:
        if isinstance(arena, VirtualKVArena):
            arena.close()  # its pages go back to the device now, not when collected
    collecting = runners[0]
    runner = collecting.inner
    measured = collecting.finish()
    output_tokens = sum(record.output_len for record in result.requests)
    if "energy_j" in measured:
        measured["energy_per_output_token_j"] = measured["energy_j"] / max(output_tokens, 1)
    result = replace(result, step_columns=tuple(collecting.rows))
    result.summary.update(measured)
    result.summary.update(
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        arena_bytes=arena.nbytes * session.size,  # every rank's
        arena_slots=arena.num_slots,
        tensor_parallel=session.size,
        weight_bytes=weight_bytes,
        activation_bytes=activation_bytes,
        attention=runner.backend,
        cuda_graphs=runner.cuda_graphs,
        cuda_graph_capture_s=runner.decoder.capture_s,
        **_prefill_graph_summary(runner),
        collectors=[type(c).__name__ for c in collecting.collectors],
    )
    if isinstance(arena, VirtualKVArena):
        result.summary.update(arena.stats())
    return result


def _prefill_graph_summary(runner) -> dict:
    """With `--prefill-graphs`: the prefill steps replayed from a graph, the capture time."""
    graphs = runner.prefill_graphs
    if graphs is None:
        return {}
    return {"prefill_graph_replays": graphs.replays, "prefill_graph_capture_s": graphs.capture_s}
