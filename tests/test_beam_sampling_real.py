"""Sharing the KV cache in real decoding (CPU, fp32): beam search and parallel sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines import ENGINES, EngineOptions
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request, Trace
from tests.support import VIRTUAL_CLOCK

CPU = torch.device("cpu")


def tiny(name: str):
    spec = get_model(name)
    return spec, random_model(spec, torch.float32, CPU, seed=3)


def trace_of(lengths, *, n: int = 1, beam: int = 1, spacing: float = 0.02, vocab: int = 512) -> Trace:
    """Requests with real prompt ids (so a run's seed changes the sampling, not the prompt)."""
    rng = np.random.default_rng(0)
    return Trace(
        "groups",
        tuple(
            Request(i, spacing * i, p, o, tuple(rng.integers(0, vocab, p).tolist()), n=n, beam_width=beam)
            for i, (p, o) in enumerate(lengths)
        ),
    )


def decode(engine: str, model, spec, trace: Trace, *, num_slots: int = 600, temperature=0.0, seed=5,
           device=CPU, max_batch: int = 2, cuda_graphs: bool = False, attention: str = "torch",
           keep_logits: bool = False):  # fmt: skip
    """max_batch 2 (the default): the groups' outputs outgrow the decode buffers, which regrow.

    Steps last what the virtual clock prices: requests 20 ms apart meet running groups, and
    which join which batch is the same in every run of a comparison (eager or graphed, every
    machine under any load), so compared tokens differ only by what the compared paths compute."""
    arena = KVArena(spec, num_slots, torch.float32, device)
    arena.fill(float("nan"))  # a read of anything not copied or computed would show
    sched = ENGINES[engine].build(EngineOptions(num_slots=num_slots, max_len=64, block_size=4))
    runner = ModelRunner(
        model, arena, sched.allocator, max_batch=max_batch, max_len=64, temperature=temperature, seed=seed,
        attention=attention, cuda_graphs=cuda_graphs, keep_logits=keep_logits, clock=VIRTUAL_CLOCK,
    )  # fmt: skip
    return Engine(sched, runner).run(trace)


def outputs(run) -> list[list[tuple[tuple[int, ...], float]]]:
    """Per request, every output's tokens and score (member order)."""
    return [
        [(tuple(m.output_ids), m.score) for m in (seq.group.members if seq.group else (seq,))]
        for seq in run.sequences
    ]


@torch.inference_mode()
def full_logprobs(model, spec, ids: list[int]) -> list[float]:
    """log-softmax of the next token after `ids`, from a forward over all of them (no cache)."""
    length = len(ids)
    arena = KVArena(spec, length, torch.float32, CPU)
    meta = AttentionMetadata(
        True, torch.arange(length), torch.tensor([0, length]), torch.tensor([length], dtype=torch.int32),
        starts=torch.tensor([0]), max_new=length, backend="torch",
    )  # fmt: skip
    logits = model(torch.tensor(ids), torch.arange(length), meta, arena)  # [1, V]
    return torch.log_softmax(logits[0].float(), dim=-1).double().tolist()


def reference_beam_search(model, spec, prompt: list[int], width: int, steps: int):
    """Straightforward beam search: every beam's whole vocabulary, the best `width` kept."""
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    for _ in range(steps):
        pairs = []
        for index, (out, score) in enumerate(beams):
            pairs += [(score + lp, index, t) for t, lp in enumerate(full_logprobs(model, spec, prompt + out))]
        pairs.sort(key=lambda pair: -pair[0])
        beams = [([*beams[index][0], token], score) for score, index, token in pairs[:width]]
    return beams


@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-opt"])
def test_beam_search_equals_a_reference_beam_search(model_name):
    spec, model = tiny(model_name)
    lengths = [(9, 5), (5, 7), (14, 4), (12, 5)]
    trace = trace_of(lengths, beam=3)
    expected = [
        reference_beam_search(model, spec, list(r.prompt_ids), 3, r.output_len) for r in trace.requests
    ]
    runs = {engine: decode(engine, model, spec, trace) for engine in ("paged", "orca-oracle")}
    # paged, everyone at once in an arena so small that beam groups are preempted and recomputed
    runs["paged-tight"] = decode("paged", model, spec, trace_of(lengths, beam=3, spacing=0.0), num_slots=64)
    assert sum(seq.num_preemptions for seq in runs["paged-tight"].sequences) > 0
    for name, run in runs.items():
        for got, want in zip(outputs(run), expected, strict=True):
            assert [tokens for tokens, _ in got] == [tuple(tokens) for tokens, _ in want], name
            assert [score for _, score in got] == pytest.approx([score for _, score in want], abs=1e-4)
        leader_scores = [seq.score for seq in run.sequences]
        assert leader_scores == [max(m.score for m in seq.group.members) for seq in run.sequences]


def test_parallel_samples_are_the_same_in_every_engine_and_each_is_its_seed_alone():
    spec, model = tiny("tiny-llama")
    lengths = [(9, 6), (5, 8), (14, 1), (6, 5)]
    trace = trace_of(lengths, n=3)
    runs = [decode(e, model, spec, trace, temperature=0.8) for e in ("paged", "orca-oracle", "static")]
    # everyone at once in a small arena: samples are preempted (and recomputed)
    runs.append(
        decode("paged", model, spec, trace_of(lengths, n=3, spacing=0.0), num_slots=64, temperature=0.8)
    )
    assert sum(seq.num_preemptions for m in runs[-1].sequences for seq in m.group.members) > 0
    results = [outputs(run) for run in runs]
    assert all(result == results[0] for result in results)
    samples = results[0]
    assert any(len({tokens for tokens, _ in request}) == 3 for request in samples)  # samples differ
    for s in range(3):  # sample s draws what the request alone draws with seed 5 + s
        alone = decode("paged", model, spec, trace_of(lengths), temperature=0.8, seed=5 + s)
        assert [request[s][0] for request in samples] == [tuple(seq.output_ids) for seq in alone.sequences]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("engine", ["paged", "orca-oracle"])
def test_group_steps_replayed_from_graphs_equal_eager_steps(engine):
    """Beam candidates come from the logits a graph replay leaves in its pool (`keep_logits`):
    the same tokens as eager steps and the same scores to fp32 rounding (a graph pads its rows to
    its bucket, so the split-KV kernel may split differently), for beams and parallel samples."""
    pytest.importorskip("triton")  # graphs need the Triton kernels: without them both runs are eager
    cuda = torch.device("cuda")
    spec = get_model("tiny-opt")
    model = random_model(spec, torch.float32, cuda, seed=3)
    for trace, temperature in ((trace_of([(5, 9), (7, 6), (3, 12)], beam=3), 0.0),
                               (trace_of([(5, 9), (7, 6)], n=3), 1.0)):  # fmt: skip
        runs = [
            decode(
                engine,
                model,
                spec,
                trace,
                temperature=temperature,
                device=cuda,
                max_batch=16,
                cuda_graphs=graphs,
                attention="auto",
                keep_logits=graphs,
            )
            for graphs in (False, True)
        ]
        eager, graphed = (outputs(run) for run in runs)
        assert [[tokens for tokens, _ in r] for r in eager] == [[tokens for tokens, _ in r] for r in graphed]
        scores = [[float("nan") if s is None else s for r in run for _, s in r] for run in (eager, graphed)]
        assert scores[1] == pytest.approx(scores[0], rel=1e-5, abs=1e-5, nan_ok=True)
