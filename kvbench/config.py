"""A run's configuration: frozen, validated once, written to config.json to rerun it.

Validation turns every bad value into a one-line `KvbenchError` naming the CLI flag, so
nothing downstream has to re-check user input.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from engines import ARENAS, BLOCKS, FIT, PAGES, SWAP, WATERMARK, EngineOptions, get_engine
from engines.batch import DEFAULT_MAX_NUM_SEQS
from engines.scheduler import SchedulerConfig
from kvbench.budget import GIB, MAX_SLOTS, KVBudget, budget_emulating, budget_from_gib, get_gpu
from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_flags, check_workload
from kvbench.kvspec.model import EXPERT_DISPATCHES
from kvbench.metrics.summary import DEFAULT_PERCENTILES, Slo, check_metric_options
from kvbench.models import ModelSpec, get_model
from kvbench.parallel.sizes import check_tensor_parallel
from kvbench.plugins import EXTERNAL, is_external
from kvbench.requests import Request, Trace
from kvbench.vmm.pages import DEFAULT_PAGE_KIB, page_geometry
from workloads.spec import WorkloadSpec, build_trace

VMM_MAPS = ("sync", "ahead")  # --vmm-map (kvbench.real.model_runner; simulated: CostModelRunner)
DEFAULT_GPU = "a100-40gb"  # the paper's GPU: budgets and step times are emulated on it


@dataclass(frozen=True)
class RunConfig:
    engine: str
    model: str = "opt-13b"
    workload: WorkloadSpec = field(default_factory=lambda: WorkloadSpec(rate=1.0))
    kv_cache_gib: float | None = None  # KV budget; None: derived from emulate_gpu
    emulate_gpu: str = DEFAULT_GPU  # sizes the budget (unless kv_cache_gib) and the cost model
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_seqs: int | None = None  # None: 256 for continuous batching, memory-bound for static
    max_num_batched_tokens: int | None = None  # None: max(model max length, 2048), as vLLM
    chunked_prefill: bool = False  # continuous engines: the budget per step, prompts in chunks
    contiguous_fit: str = "buddy"
    watermark: float = 0.01
    preemption: str = "recompute"  # paged engines: recompute or swap
    swap_space_gib: float = 4.0  # paged engines: host memory for swapped blocks (vLLM's default)
    vmm_layout: str = "per-layer"  # vmm: vAttention's tensor per layer, or one range per request
    vmm_page_kib: int = DEFAULT_PAGE_KIB  # vmm: physical page size (the driver's granularity)
    vmm_map: str = "sync"  # vmm: map pages just before the step needing them, or one segment ahead
    cost_model: str | None = None  # a `kvbench calibrate` file; None: the roofline of the GPU
    cost_fixed_s: float | None = None  # cost-model overrides (of the calibrated or roofline model)
    cost_per_token_s: float | None = None
    cost_per_kv_token_s: float | None = None
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES  # of TTFT, TPOT, ITL, E2EL, queueing delay
    slo: Slo = field(default_factory=Slo)  # goodput counts the requests meeting every given objective
    device: str = "cpu"  # real runs: cuda or cpu
    dtype: str = "auto"  # real runs: float16, bfloat16, float32; auto: bf16 on GPUs, fp32 on CPU
    temperature: float = 0.0  # real runs: 0 is greedy; else seeded sampling
    weights_seed: int = 0  # real runs: seed of a preset's random weights
    attention: str = "auto"  # real runs: triton kernels, torch reference, or auto (triton on CUDA)
    cuda_graphs: bool = True  # real runs: replay decode steps as CUDA graphs (needs the kernels)
    prefill_graphs: bool = False  # real runs: short prefills from static buffers, graphed with decode
    expert_dispatch: str = "dense"  # real runs of MoE models: how a decode step runs the experts
    tensor_parallel: int = 1  # real runs: GPUs one model is split across; budgets stay the model's
    collectors: str = "torch,nvml,roofline"  # real runs on CUDA: what to measure beside the steps; or +host
    hf_batch_size: int = 32  # hf-generate: requests per padded generate() batch
    hf_block_size: int | None = None  # hf-cb: tokens per cache block; None: transformers' default
    hf_memory: float | None = None  # hf-cb: share of free GPU memory for its cache; None: the KV budget
    hf_attn: str = "paged|sdpa"  # external engines: transformers attention implementation

    def to_dict(self) -> dict:
        return asdict(self)


# The fields that set what only some engines read (`engines.EngineSpec.reads`), each with the
# engine option it sets: a flag no engine of a run reads is refused (kvbench.cli.options), and a
# sweep cell's engine runs, and records, its defaults (`unread_at_defaults`)
ENGINE_FIELDS: dict[str, str] = {
    "block_size": BLOCKS,
    "contiguous_fit": FIT,
    "watermark": WATERMARK,
    "preemption": SWAP,
    "swap_space_gib": SWAP,
    "vmm_layout": PAGES,
    "vmm_page_kib": PAGES,
    "vmm_map": PAGES,
}


def engine_reads(engine: str) -> frozenset[str]:
    """The engine options `engine` is built from (none for an external engine: it keeps its own
    cache); an unknown name is the one-line error that names --engine."""
    return frozenset() if is_external(engine) else get_engine(engine).reads


def unread_fields(config: RunConfig) -> frozenset[str]:
    """The `ENGINE_FIELDS` that cannot shape `config`'s run: those its engine does not read, and
    --swap-space-gib unless its preemption swaps."""
    reads = engine_reads(config.engine)
    unread = {name for name, option in ENGINE_FIELDS.items() if option not in reads}
    return frozenset(unread | ({"swap_space_gib"} if config.preemption != "swap" else set()))


def unread_at_defaults(config: RunConfig) -> RunConfig:
    """`config` with its `unread_fields` at their defaults, so a run records in config.json only
    what shaped it: a sweep's cell of an engine that ignores an axis or flag another of its
    engines reads (orca-oracle in a sweep of --block-sizes 8,16), or a config built in Python.
    (The CLI refuses such a flag for a run whose engines all ignore it.)"""
    defaults = RunConfig.__dataclass_fields__
    return replace(config, **{name: defaults[name].default for name in unread_fields(config)})


@dataclass(frozen=True)
class Prepared:
    """Everything a run needs, resolved from a `RunConfig`."""

    config: RunConfig
    model: ModelSpec
    budget: KVBudget
    options: EngineOptions
    cost: CostModel
    trace: Trace


def _positive_int(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise KvbenchError(f"{flag} must be a positive integer, got {value}")


# the step budget under --chunked-prefill when the flag is unset (vLLM's chunked default): the
# unchunked default, a model's whole length, would let one long prompt fill a step of a
# long-context model and stall every decode through it (results/reference/hybrid-long-chunked-sim)
CHUNKED_BATCHED_TOKENS = 2048


def batched_tokens(config: RunConfig, model: ModelSpec) -> int:
    """Prompt tokens per prefill step: the flag, else max(model max length, 2048) as vLLM; under
    --chunked-prefill, every step's token budget: the flag, else `CHUNKED_BATCHED_TOKENS`."""
    if config.max_num_batched_tokens:
        return config.max_num_batched_tokens
    return CHUNKED_BATCHED_TOKENS if config.chunked_prefill else max(model.max_len, 2048)


def prepare(
    config: RunConfig, *, weight_bytes: int | None = None, activation_bytes: int | None = None
) -> Prepared:
    """Resolve and validate `config`; for emulated budgets, what the loaded model measured."""
    check_flags({f.name: getattr(config, f.name) for f in fields(config)})  # each flag's range
    config = unread_at_defaults(config)  # what cannot shape the run is not recorded as if it had
    check_workload(config.workload)
    check_real_options(config)
    spec = None if is_external(config.engine) else get_engine(config.engine)  # external: transformers'
    if spec is None:
        EXTERNAL[config.engine].check(config)
    model = resolve_model(config.model)
    gpu = get_gpu(config.emulate_gpu)
    bs = config.block_size
    if bs < 1 or bs & (bs - 1):
        raise KvbenchError(f"--block-size must be a positive power of two, got {bs}")
    _positive_int("--max-num-seqs", config.max_num_seqs)
    check_metric_options(config.percentiles, config.slo)
    _positive_int("--max-num-batched-tokens", config.max_num_batched_tokens)
    check_tensor_parallel(model, config.tensor_parallel)
    if config.tensor_parallel > 1 and spec is None:
        raise KvbenchError(f"--tensor-parallel {config.tensor_parallel}: external engines run in one process")
    tokens = batched_tokens(config, model)
    if config.chunked_prefill:
        check_chunked(config, tokens)
    elif tokens < model.max_len:
        raise KvbenchError(
            f"--max-num-batched-tokens {tokens} is below {model.name}'s maximum length "
            f"{model.max_len}: a long prompt could never be scheduled"
        )
    if config.contiguous_fit not in ARENAS:
        choices = ", ".join(ARENAS)
        raise KvbenchError(f"unknown --contiguous-fit {config.contiguous_fit!r}; choose one of: {choices}")
    if not 0 <= config.watermark < 1:
        raise KvbenchError(f"--watermark must be in [0, 1), got {config.watermark}")
    if config.kv_cache_gib is not None:
        budget = budget_from_gib(config.kv_cache_gib, model)
    else:
        budget = budget_emulating(
            gpu,
            model,
            utilization=config.gpu_memory_utilization,
            max_num_batched_tokens=tokens,
            max_num_seqs=config.max_num_seqs or 256,
            weight_bytes=weight_bytes,
            activation_bytes=activation_bytes,
            gpus=config.tensor_parallel,
        )
    if bs > budget.num_slots:
        raise KvbenchError(f"--block-size {bs} exceeds the KV arena ({budget.num_slots} slots)")
    if config.preemption not in ("recompute", "swap"):
        raise KvbenchError(f"unknown --preemption {config.preemption!r}; choose one of: recompute, swap")
    if not math.isfinite(config.swap_space_gib) or config.swap_space_gib < 0:
        raise KvbenchError(f"--swap-space-gib must be a number >= 0, got {config.swap_space_gib}")
    host_blocks = int(config.swap_space_gib * GIB // (bs * model.kv_bytes_per_token))
    if config.preemption == "swap" and host_blocks * bs > MAX_SLOTS:  # each block is a free-list entry
        raise KvbenchError(
            f"--swap-space-gib {config.swap_space_gib:g} holds {host_blocks * bs:,} token slots of "
            f"{model.name}, more than kvbench's limit of {MAX_SLOTS:,}"
        )
    roofline = CostModel.roofline(model, gpu, bs)
    base = roofline
    if config.cost_model is not None:  # fitted to real runs by `kvbench calibrate`
        from kvbench.calibrate.fit import load_cost_model

        base = load_cost_model(config.cost_model, model.name, config.engine)  # its own fit, if any
    cost = replace(  # a fitted file's other terms (knee, page maps, what it assumed) as it gives them
        base,
        fixed_s=_or(config.cost_fixed_s, base.fixed_s, "--cost-fixed-s"),
        # a given per-step cost is every weight read of a step, a MoE model's routed experts too
        routed_experts_s=0.0 if config.cost_fixed_s is not None else base.routed_experts_s,
        expert_pick=0.0 if config.cost_fixed_s is not None else base.expert_pick,
        per_token_s=_or(config.cost_per_token_s, base.per_token_s, "--cost-per-token-s"),
        per_kv_token_s=_or(config.cost_per_kv_token_s, base.per_kv_token_s, "--cost-per-kv-token-s"),
        # runs without swaps fit none, nor do runs without sharing: the roofline's, at this block size
        per_swap_block_s=_fitted(base, "per_swap_block_s") or roofline.per_swap_block_s,
        per_copy_slot_s=_fitted(base, "per_copy_slot_s") or roofline.per_copy_slot_s,
        per_map_page_s=_fitted(base, "per_map_page_s") or roofline.per_map_page_s,  # nor runs without vmm
        per_unmap_page_s=_fitted(base, "per_unmap_page_s") or roofline.per_unmap_page_s,
        per_prefill_s=base.per_prefill_s,
        # an explicit --cost-per-token-s is every token's cost, prefill tokens' too
        per_prefill_token_s=None if config.cost_per_token_s is not None else base.per_prefill_token_s,
    )
    if not cost.takes_time():
        raise KvbenchError("--cost-fixed-s, --cost-per-token-s, --cost-per-kv-token-s: a step must take time")
    trace = build_trace(config.workload)
    check_trace(trace, model, config.workload.prefix)
    if spec is None and any(r.n > 1 or r.beam_width > 1 for r in trace.requests):
        raise KvbenchError(
            f"--engine {config.engine}: external engines run one output per request (no --n, --beam-width)"
        )
    if config.chunked_prefill and any(r.n > 1 or r.beam_width > 1 for r in trace.requests):
        raise KvbenchError(
            "--chunked-prefill: requests with several outputs (--n, --beam-width) fork after a single "
            "prefill step; run them without it"
        )
    pages = page_geometry(model, budget.budget_bytes, config.vmm_layout, config.vmm_page_kib)
    options = EngineOptions(
        num_slots=budget.num_slots,
        max_len=model.max_len,
        block_size=bs,
        contiguous_fit=config.contiguous_fit,
        watermark=config.watermark,
        host_blocks=host_blocks if config.preemption == "swap" else 0,
        hash_block_size=trace.hash_block_size,
        page_tokens=pages.page_tokens,
        num_pages=pages.num_pages,
        driver_pages=pages.page_bytes // pages.driver_page_bytes,
        kv_groups=model.groups,
        scheduler=SchedulerConfig(config.max_num_seqs, tokens, config.preemption, config.chunked_prefill),
    )
    if spec is not None:
        spec.build(options)  # fail now, not mid-sweep, if the engine cannot be built
    return Prepared(config, model, budget, options, cost, trace)


def check_chunked(config: RunConfig, tokens: int) -> None:
    """Chunked prefill splits prompts, so the budget may be below the model's length, but every
    running decode must fit in a step with a token to spare for a chunk (`engines.chunked`)."""
    if is_external(config.engine):
        raise KvbenchError(f"--chunked-prefill: external engine {config.engine} schedules itself")
    seqs = config.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    if tokens < seqs:
        raise KvbenchError(
            f"--max-num-batched-tokens {tokens} is below --max-num-seqs {seqs}: with --chunked-prefill "
            "every running request's decode token must fit in each step's budget"
        )


def check_real_options(config: RunConfig) -> None:
    """Real-run flags that contradict one another: checked before a model is loaded (and by
    `prepare`, so a simulation refuses a bad --vmm-map too, which it prices as a real run maps)."""
    on_cuda = config.device.startswith("cuda")
    if config.attention == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise KvbenchError(
            f"--attention triton needs a CUDA --device, not {config.device} (--attention torch runs "
            "there; TRITON_INTERPRET=1 runs the kernels in Triton's interpreter)"
        )
    if config.engine == "vmm" and config.tensor_parallel > 1:
        raise KvbenchError("--engine vmm maps its virtual arena on one GPU: use --tensor-parallel 1")
    if config.vmm_map not in VMM_MAPS:
        raise KvbenchError(f"--vmm-map must be one of {', '.join(VMM_MAPS)}, got {config.vmm_map!r}")
    if config.expert_dispatch not in EXPERT_DISPATCHES:
        raise KvbenchError(
            f"--expert-dispatch must be one of {', '.join(EXPERT_DISPATCHES)}, got {config.expert_dispatch!r}"
        )


def with_expert_dispatch(config: RunConfig) -> RunConfig:
    """`--expert-dispatch auto` (the flag's default) made concrete before a run or a sweep records
    it: `grouped` on a model with experts (2.1-2.4x faster decode steps than `dense` on
    DeepSeek-V2-Lite, results/reference/mla-vs-dense), `dense` on one without. Why resolved, not
    kept as `auto`: `--resume` compares a cell's recorded settings with the plan's, and every
    cell of a dense model has recorded `dense`; `auto` would make all of them another setting's."""
    if config.expert_dispatch != "auto":
        return config
    dispatch = "grouped" if resolve_model(config.model).moe is not None else "dense"
    return replace(config, expert_dispatch=dispatch)


def _fitted(cost: CostModel, name: str) -> float:
    """A cost term as fitted, 0 where the fit assumed it (`CostModel.assumed`)."""
    return 0.0 if name in cost.assumed else getattr(cost, name)


def resolve_model(name: str) -> ModelSpec:
    """A preset by name, or the architecture of a local Hugging Face checkpoint folder."""
    if Path(name).is_dir():
        from kvbench.modeling.weights import read_checkpoint_spec

        return read_checkpoint_spec(Path(name))
    return get_model(name)


def check_trace(trace: Trace, model: ModelSpec, prefix: str | None = None) -> None:
    """Refuse requests the model cannot hold, naming the first offender (and `--prefix`, the
    shared prefix prepended to every prompt, where that is what makes it too long)."""
    for request in trace.requests:
        if request.output_len < 1 or request.prompt_len < 1:
            raise KvbenchError(
                f"--trace {trace.name}: request {request.request_id} needs a prompt and an output "
                f"of at least 1 token, got {request.prompt_len} and {request.output_len}"
            )
        if request.n > 1 and request.beam_width > 1:
            raise KvbenchError(
                f"--trace {trace.name}: request {request.request_id} asks for n={request.n} samples "
                f"and beam width {request.beam_width}; give one of --n and --beam-width"
            )
        if request.total_len > model.max_len:
            if prefix is not None and request.total_len - request.prefix_len <= model.max_len:
                raise KvbenchError(_prefix_too_long(prefix, request, model))
            raise KvbenchError(
                f"--trace {trace.name}: request {request.request_id} has prompt "
                f"{request.prompt_len} + output {request.output_len} tokens, more than "
                f"{model.name}'s maximum length {model.max_len} (--model; --max-total-len "
                f"{model.max_len} drops such requests)"
            )


def _prefix_too_long(prefix: str, request: Request, model: ModelSpec) -> str:
    """The error for a request that fits the model without the `--prefix` prepended to it but
    not with it: the flag to change is --prefix (or --max-total-len, which drops requests before
    the prefix is added, so it must leave the prefix room), not --trace or --model."""
    room = model.max_len - request.prefix_len  # tokens left beside the prefix
    if room < 2:  # not even a 1-token prompt and a 1-token output
        return (
            f"--prefix {prefix}: {request.prefix_len} tokens leave no room for a prompt and an output "
            f"in {model.name}'s maximum length {model.max_len}"
        )
    return (
        f"--prefix {prefix}: request {request.request_id} has {request.prefix_len} prefix + "
        f"{request.prompt_len - request.prefix_len} prompt + {request.output_len} output tokens, "
        f"more than {model.name}'s maximum length {model.max_len} (--max-total-len {room} drops "
        "such requests before the prefix is added)"
    )


def _or(value: float | None, default: float, flag: str) -> float:
    if value is None:
        return default
    if not math.isfinite(value) or value < 0:
        raise KvbenchError(f"{flag} must be a non-negative number, got {value}")
    return value
