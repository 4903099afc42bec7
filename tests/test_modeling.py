"""Real decoding on CPU: kvbench's models against transformers, and engines against each other."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from engines import ENGINES, EngineOptions  # noqa: E402
from engines.scheduler import SchedulerConfig  # noqa: E402
from kvbench.cost_model import CostModel, CostModelRunner  # noqa: E402
from kvbench.engine import Engine  # noqa: E402
from kvbench.errors import KvbenchError  # noqa: E402
from kvbench.modeling.arena import KVArena  # noqa: E402
from kvbench.modeling.attention import AttentionMetadata, triton_available  # noqa: E402
from kvbench.modeling.weights import load_checkpoint, random_model, read_checkpoint_spec  # noqa: E402
from kvbench.models import get_model  # noqa: E402
from kvbench.real.model_runner import (  # noqa: E402
    ModelRunner,
    _step_addressing,
    padded_tokens,
    prompt_token_ids,
)
from kvbench.requests import Request, Trace  # noqa: E402
from tests.support import INTERPRETED, INTERPRETING, VIRTUAL_CLOCK  # noqa: E402

CPU = torch.device("cpu")
HAS_TRITON = triton_available()
DEVICES = [
    pytest.param(CPU, id="cpu"),
    pytest.param(
        torch.device("cuda"),
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")],
    ),
]


def hf_reference(kind: str):
    """A tiny transformers model with random weights, and its config as a dict."""
    torch.manual_seed(0)
    if kind == "opt":
        cfg = transformers.OPTConfig(
            vocab_size=101, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
            max_position_embeddings=64, word_embed_proj_dim=32,
        )  # fmt: skip
        model = transformers.OPTForCausalLM(cfg).eval()
        with torch.no_grad():  # transformers starts biases at 0: random ones test their order (qkv)
            for name, param in model.named_parameters():
                if name.endswith("bias"):
                    param.normal_(0.0, 0.02)
        return model, cfg
    cfg = transformers.LlamaConfig(
        vocab_size=101, hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rope_theta=5000.0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval(), cfg


def checkpoint(tmp_path, kind: str):
    """Save a tiny model and load it back with transformers: the reference is what the files say
    (an OPT checkpoint stores no LM head; loading ties it to the embedding)."""
    model, _ = hf_reference(kind)
    model.save_pretrained(tmp_path / kind, safe_serialization=True)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / kind, local_files_only=True)
    return reloaded.eval(), tmp_path / kind


BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["opt", "llama"])
@pytest.mark.parametrize("paged", [True, False])
def test_logits_equal_transformers_for_prefill_and_decode(tmp_path, kind, paged, backend, device):
    """A prompt prefilled in two chunks (the second extends a stored prefix), then decode steps."""
    if backend == "triton" and device.type == "cpu" and not INTERPRETING:
        pytest.skip("CPU tensors need Triton's interpreter")
    ref, folder = checkpoint(tmp_path, kind)
    model = load_checkpoint(folder, torch.float32, device)
    spec = model.spec
    ids = torch.randint(0, spec.vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids).logits  # [2, 9, V] on the CPU
    arena = KVArena(spec, 64, torch.float32, device)
    arena.fill(float("nan"))  # anything read before being written would show
    # sequence 0 in blocks [5, 2, 7], sequence 1 in blocks [0, 3, 6] (block size 4), or extents at 8 and 40
    tables = torch.tensor([[5, 2, 7], [0, 3, 6]], dtype=torch.int32, device=device)
    starts = torch.tensor([8, 40], device=device)
    addressing = {"block_tables": tables, "block_size": 4} if paged else {"starts": starts}

    def slots(positions: list[int]) -> torch.Tensor:
        pos = torch.tensor(positions, device=device)
        if paged:
            return torch.cat([tables[b, pos // 4].long() * 4 + pos % 4 for b in range(2)])
        return torch.cat([starts[b] + pos for b in range(2)])

    def forward(lo: int, hi: int) -> torch.Tensor:
        """Positions [lo, hi) of both sequences; logits of the last."""
        n = hi - lo
        meta = AttentionMetadata(
            n > 1, slots(list(range(lo, hi))), torch.tensor([0, n, 2 * n], device=device),
            torch.tensor([hi, hi], dtype=torch.int32, device=device), max_new=n, num_splits=2,
            backend=backend, **addressing,
        )  # fmt: skip
        with torch.no_grad():
            positions = torch.arange(lo, hi, device=device).repeat(2)
            return model(ids[:, lo:hi].reshape(-1).to(device), positions, meta, arena).cpu()

    assert (forward(0, 3) - expected[:, 2]).abs().max() < 1e-4
    assert (forward(3, 5) - expected[:, 4]).abs().max() < 1e-4  # attends to the stored 0..2
    for step in range(5, 9):
        assert (forward(step, step + 1) - expected[:, step]).abs().max() < 1e-4, f"decode step {step}"


def small_trace(count: int = 10, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    prompts, outputs = rng.integers(3, 24, count), rng.integers(1, 16, count)
    return Trace(
        "small",
        tuple(
            Request(i, 0.01 * i, int(p), int(o))
            for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
        ),
    )


class RecordingRunner(ModelRunner):
    """The real runner, remembering every arena slot a call was entitled to write: the
    allocator's addressing of the positions the call computed."""

    written: set[int]

    def run(self, batch, max_steps, start_s, until_s):
        before = [(self.allocator.addressing(seq), seq.num_computed) for seq in batch.seqs]
        result = super().run(batch, max_steps, start_s, until_s)
        for seq, (where, computed) in zip(batch.seqs, before, strict=True):
            # prefill: the new tokens; a decode segment: one position per step run
            count = seq.num_tokens - computed if batch.is_prefill else len(result.durations)
            self.written = getattr(self, "written", set()) | set(
                _step_addressing([where], [np.arange(computed, computed + count)], CPU)[0].tolist()
            )
        return result


def engine_options(num_slots: int, *, block_size=4, preemption="recompute", host_blocks=0) -> EngineOptions:
    return EngineOptions(
        num_slots=num_slots, max_len=64, block_size=block_size, host_blocks=host_blocks,
        scheduler=SchedulerConfig(preemption=preemption),
    )  # fmt: skip


def decode_all(
    engine: str, model_name: str, num_slots: int, *, temperature=0.0, block_size=4, poison=True, device=CPU,
    preemption="recompute", host_blocks=0, coalesce=True, attention="torch", cuda_graphs=True,
    clock: CostModel | None = VIRTUAL_CLOCK, requests=10,
):  # fmt: skip
    """Every request of `small_trace(requests)` decoded for real. Steps last what `clock` prices (the
    default: the schedule is the same on any machine under any load); `clock=None`: measured."""
    spec = get_model(model_name)
    model = random_model(spec, torch.float32, device, seed=3)
    arena = KVArena(spec, num_slots, torch.float32, device)
    if poison:
        arena.fill(float("nan"))
    options = engine_options(num_slots, block_size=block_size, preemption=preemption, host_blocks=host_blocks)
    sched = ENGINES[engine].build(options)
    runner = RecordingRunner(
        model, arena, sched.allocator, max_batch=10, max_len=64, temperature=temperature, seed=5,
        attention=attention, cuda_graphs=cuda_graphs, clock=clock,
    )  # fmt: skip
    run = Engine(sched, runner, coalesce=coalesce).run(small_trace(requests))
    return run, runner, arena


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_name", ["tiny-opt", "tiny-llama"])
def test_greedy_tokens_are_identical_across_engines(model_name, device):
    """Every engine, in multi-step segments and step by step; on CUDA with and without graphs.

    Measured step times (`clock=None`): the wall-clock path, segments cut by measured step ends,
    is exercised here, where nothing asserted depends on the schedule."""
    tokens = {}
    for engine in ("static", "orca-max", "orca-pow2", "orca-oracle", "paged"):
        for coalesce in (True, False):
            attention = "triton" if device.type == "cuda" else "torch"
            run, _, _ = decode_all(
                engine, model_name, 300, device=device, coalesce=coalesce, attention=attention, clock=None
            )
            for seq in run.sequences:
                assert len(seq.output_ids) == seq.request.output_len
            tokens[engine, coalesce] = [tuple(seq.output_ids) for seq in run.sequences]
            if coalesce:
                assert any(row.num_steps > 1 for row in run.steps)  # segments were exercised
    if device.type == "cuda":
        run, _, _ = decode_all("paged", model_name, 300, device=device, attention="triton", cuda_graphs=False)
        tokens["eager"] = [tuple(seq.output_ids) for seq in run.sequences]
    assert len(set(map(tuple, tokens.values()))) == 1, "engines disagree on greedy tokens"


@pytest.mark.skipif(not HAS_TRITON, reason="no triton")
@INTERPRETED
@pytest.mark.parametrize("engine", ["paged", "orca-oracle"])
def test_triton_kernels_give_the_reference_tokens(engine):
    """The whole runner on the Triton kernels (interpreted on CPU) against the PyTorch reference.
    Six requests, not ten (every step runs interpreted kernels): prompts of 3-20 tokens over
    4-token blocks, up to 14 tokens out, decoded in batches of several sequences and segments."""
    reference, _, _ = decode_all(engine, "tiny-llama", 300, requests=6)
    kernels, _, _ = decode_all(engine, "tiny-llama", 300, attention="triton", requests=6)
    assert [s.output_ids for s in kernels.sequences] == [s.output_ids for s in reference.sequences]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_recompute_preemption_gives_the_same_tokens(temperature):
    roomy, _, _ = decode_all("paged", "tiny-llama", 1024, temperature=temperature)
    tight, _, _ = decode_all("paged", "tiny-llama", 48, temperature=temperature)
    assert sum(seq.num_preemptions for seq in tight.sequences) > 0  # the case is exercised
    assert [s.output_ids for s in tight.sequences] == [s.output_ids for s in roomy.sequences]
    if temperature:
        greedy, _, _ = decode_all("paged", "tiny-llama", 1024)
        assert [s.output_ids for s in greedy.sequences] != [s.output_ids for s in roomy.sequences]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ["paged", "paged-static"])
def test_swap_preemption_gives_the_same_tokens(engine, device):
    roomy, _, _ = decode_all(engine, "tiny-llama", 1024, device=device)
    swapped, _, _ = decode_all(engine, "tiny-llama", 48, preemption="swap", host_blocks=64, device=device)
    assert sum(seq.num_preemptions for seq in swapped.sequences) > 0  # the case is exercised
    assert any(row.num_swapped for row in swapped.steps)
    assert [s.output_ids for s in swapped.sequences] == [s.output_ids for s in roomy.sequences]
    # with no host room, swap falls back to recompute, and tokens still agree
    fallback, _, _ = decode_all(engine, "tiny-llama", 48, preemption="swap", host_blocks=0, device=device)
    assert not any(row.num_swapped for row in fallback.steps)
    assert [s.output_ids for s in fallback.sequences] == [s.output_ids for s in roomy.sequences]


@pytest.mark.parametrize(
    ("engine", "preemption", "host_blocks"),
    [("paged", "swap", 64), ("paged-static", "recompute", 0)],
)
def test_a_virtual_clock_gives_a_real_run_the_simulators_schedule(engine, preemption, host_blocks):
    """With `clock=`, the model decodes every token but the engine sees the cost model's step
    times: every row (admissions, segment lengths cut at arrivals, preemptions, swaps, times) is
    the simulator's with that cost model, on any machine under any load."""
    num_slots = 48
    real, _, _ = decode_all(engine, "tiny-llama", num_slots, preemption=preemption, host_blocks=host_blocks)
    options = engine_options(num_slots, preemption=preemption, host_blocks=host_blocks)
    simulated = Engine(ENGINES[engine].build(options), CostModelRunner(VIRTUAL_CLOCK)).run(small_trace())
    assert real.steps == simulated.steps
    assert all(len(seq.output_ids) == seq.request.output_len for seq in real.sequences)
    # the cases the schedule is about are exercised: segments, requests waiting for memory,
    # preemption (with swap: K/V in host memory)
    assert any(row.num_steps > 1 for row in real.steps)
    assert any(row.num_waiting for row in real.steps)
    assert sum(seq.num_preemptions for seq in real.sequences) > 0
    assert any(row.num_swapped for row in real.steps) == (preemption == "swap")


def test_prefill_token_counts_round_up_to_few_buckets():
    counts = range(1, 8193)
    padded = [padded_tokens(t) for t in counts]
    assert all(
        p >= t and p % 16 == 0 and p - t < max(16, t / 16) for t, p in zip(counts, padded, strict=True)
    )
    assert len(set(padded)) <= 16 * 9  # 16 per doubling: GEMM shapes repeat across prefills


def test_a_padded_prefill_samples_what_the_bare_prompt_does():
    """The runner pads each prefill's tokens up to a bucket; the first sampled token of every
    request must equal the argmax of the model run on its prompt alone, unpadded."""
    run, runner, _ = decode_all("paged", "tiny-opt", 300)
    model, spec = runner.model, runner.model.spec
    assert any(padded_tokens(row.num_tokens) > row.num_tokens for row in run.steps if row.kind == "prefill")
    for seq in run.sequences:
        prompt = torch.from_numpy(prompt_token_ids(seq.request, spec.vocab, seed=5))  # [P]
        n = len(prompt)
        arena = KVArena(spec, n, torch.float32, CPU)
        meta = AttentionMetadata(
            True, torch.arange(n), torch.tensor([0, n]), torch.tensor([n], dtype=torch.int32),
            starts=torch.zeros(1, dtype=torch.int64), max_new=n,
        )  # fmt: skip
        with torch.no_grad():
            logits = model(prompt, torch.arange(n), meta, arena)  # [1, V]
        assert seq.output_ids[0] == int(logits.argmax()), seq.request.request_id


@pytest.mark.parametrize("engine", ["orca-oracle", "paged", "static"])
def test_the_arena_is_never_touched_outside_written_slots(engine):
    run, runner, arena = decode_all(engine, "tiny-opt", 300)
    k = arena.k.reshape(arena.k.shape[0], arena.num_slots, -1)  # [L, S, Hkv * D]
    finite = torch.isfinite(k).all(dim=(0, 2))  # [S]
    untouched = torch.isnan(k).all(dim=(0, 2))  # [S]
    written = torch.zeros(arena.num_slots, dtype=torch.bool)
    written[list(runner.written)] = True
    assert bool((finite == written).all()) and bool((untouched == ~written).all())
    assert all(seq.output_ids and all(t >= 0 for t in seq.output_ids) for seq in run.sequences)


# Under the (interpreted) Triton kernels one block size: what could write a slot is the store
# kernel, which takes flat slots (-1 for padding) whatever the block size; the block tables the
# warm-up builds are the same Python with either backend, checked at both sizes with PyTorch's.
@pytest.mark.parametrize(
    ("engine", "block_size", "attention"),
    [("paged", 4, "torch"), ("paged", 32, "torch"), ("orca-oracle", 4, "torch"),
     pytest.param("paged", 4, "triton", marks=INTERPRETED),
     pytest.param("orca-oracle", 4, "triton", marks=INTERPRETED)],
)  # fmt: skip
def test_warming_up_the_prefill_path_leaves_the_arena_untouched(engine, block_size, attention):
    """The warm-up (run on CUDA before any timed step: a prefill, then a mixed step's decode rows
    at every split count up to 16, over 2,048 positions) writes no slot of a poisoned arena,
    whatever the block size (a 16-token warm-up spans several small blocks or part of a large one)."""
    spec = get_model("tiny-opt")
    arena = KVArena(spec, 2048, torch.float32, CPU)
    arena.fill(float("nan"))
    options = EngineOptions(num_slots=2048, max_len=32, block_size=block_size, scheduler=SchedulerConfig())
    allocator = ENGINES[engine].build(options).allocator
    model = random_model(spec, torch.float32, CPU, seed=3)
    runner = ModelRunner(model, arena, allocator, max_batch=2, max_len=32, attention=attention)
    # every split count up to 16 (rows of 128 to 2,048 positions), then the large grid unsplit
    # (on the CPU's stand-in of one SM: 4 programs / 4 KV heads + 1 rows)
    assert runner.warm_up() == ((1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (2, 1))
    assert bool(torch.isnan(arena.k).all()) and bool(torch.isnan(arena.v).all())


def test_the_warm_up_skips_decode_launches_that_would_read_past_a_contiguous_arena():
    spec = get_model("tiny-opt")
    arena = KVArena(spec, 600, torch.float32, CPU)
    options = EngineOptions(num_slots=600, max_len=32, scheduler=SchedulerConfig())
    allocator = ENGINES["orca-oracle"].build(options).allocator
    model = random_model(spec, torch.float32, CPU, seed=3)
    runner = ModelRunner(model, arena, allocator, max_batch=2, max_len=32, attention="torch")
    assert runner.warm_up() == ((1, 1), (1, 2), (1, 4), (2, 1))  # 1,024 and 2,048 positions skipped


def test_checkpoint_errors_are_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KvbenchError, match="no config.json"):
        read_checkpoint_spec(empty)
    _, folder = checkpoint(tmp_path, "llama")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(KvbenchError, match="no \\*.safetensors or pytorch_model"):
        load_checkpoint(folder, torch.float32, CPU)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(KvbenchError, match="unsupported architecture 'gpt2'"):
        read_checkpoint_spec(gpt2)


def test_cost_model_and_real_runs_write_the_same_files(tmp_path):
    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from kvbench.simulate import simulate, write_result
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("uniform:prompt=4..20,output=2..8", num_requests=6, rate=100.0)
    base = dict(engine="paged", model="tiny-llama", workload=workload, kv_cache_gib=0.0005, device="cpu")
    real = run_real(RunConfig(**base, attention="torch"))  # the files are checked, not the kernels
    sim = simulate(RunConfig(**base, cost_fixed_s=0.001))
    write_result(real, tmp_path / "real")
    write_result(sim, tmp_path / "sim")
    for name in ("steps.csv", "requests.csv"):
        assert (tmp_path / "real" / name).read_text().splitlines()[0] == (
            tmp_path / "sim" / name
        ).read_text().splitlines()[0]
    real_summary = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert real_summary["mode"] == "real" and real_summary["completed"] == 6
    assert real_summary["arena_bytes"] == 2 * 2 * 2 * 16 * 4 * real_summary["num_slots"]  # fp32 on CPU
    assert set(json.loads((tmp_path / "sim" / "summary.json").read_text())) <= set(real_summary)


def test_no_garbage_collection_starts_inside_a_real_runs_engine_loop():
    """The engine loop creates objects at every step, so the cyclic collector would run inside
    timed steps; a real run pauses it for the loop and restores it after (`kvbench.gc_pause`)."""
    import gc
    import sys

    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from workloads.spec import WorkloadSpec

    loop = Engine.run.__code__
    inside: list[int] = []  # generation of each collection that started within Engine.run
    outside: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase != "start":
            return
        frame = sys._getframe()
        while frame is not None and frame.f_code is not loop:
            frame = frame.f_back
        (inside if frame is not None else outside).append(info["generation"])

    workload = WorkloadSpec("uniform:prompt=4..40,output=8..40", num_requests=60, rate=200.0, beam_width=2)
    config = RunConfig(
        engine="paged",
        model="tiny-opt",
        workload=workload,
        kv_cache_gib=0.001,
        device="cpu",
        attention="torch",
    )
    gc.callbacks.append(watch)
    try:
        run_real(config)
    finally:
        gc.callbacks.remove(watch)
    assert inside == [] and gc.isenabled()
    assert 2 in outside and 0 in outside  # a full collection before the loop, the young one after


@pytest.mark.parametrize("device", DEVICES)
def test_emulated_budget_subtracts_measured_weights_and_activations(device):
    """On CUDA the activation reserve is measured on the model; on CPU it stays the estimate."""
    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("uniform:prompt=4..20,output=2..8", num_requests=4, rate=100.0)
    config = RunConfig(
        engine="paged", model="tiny-llama", workload=workload, emulate_gpu="a100-40gb",
        gpu_memory_utilization=0.002, device=device.type,
        attention="torch" if device.type == "cpu" else "auto",  # the budget is checked, not the kernels
    )  # fmt: skip  # 80 MB: an arena the CPU can hold
    summary = run_real(config).summary
    source = summary["kv_budget_source"]
    assert "weights" in source and "(measured)" in source.split("activations")[0]
    if device.type == "cuda":
        assert summary["activation_bytes"] > 0 and source.endswith("(measured)")
    else:
        assert summary["activation_bytes"] is None and source.endswith("(estimated)")


def test_tensor_parallel_shards_of_an_opt_checkpoint_hold_their_heads_of_q_k_and_v(tmp_path):
    """The packed qkv projection (weight and bias) cut for 2 ranks: rank r's q, k and v rows are
    the checkpoint's rows of its heads, in that order."""
    from kvbench.parallel.layers import TensorParallel
    from kvbench.parallel.shard import build_shard

    ref, folder = checkpoint(tmp_path, "opt")
    spec = read_checkpoint_spec(folder)
    attn = ref.model.decoder.layers[1].self_attn
    rows = spec.hidden // 2  # one rank's heads of one part
    for rank in (0, 1):
        shard = build_shard(spec, TensorParallel(rank, 2), torch.float32, CPU, checkpoint=folder)
        qkv = shard.model.decoder.layers[1].self_attn.qkv_proj
        mine = slice(rank * rows, (rank + 1) * rows)
        for leaf in ("weight", "bias"):
            want = torch.cat([getattr(getattr(attn, p), leaf)[mine] for p in ("q_proj", "k_proj", "v_proj")])
            assert torch.equal(getattr(qkv, leaf), want), (rank, leaf)
