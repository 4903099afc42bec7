"""Workload specs end to end: spec strings, options, the `kvbench trace` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from workloads.spec import WorkloadSpec, build_trace
from workloads.stats import trace_stats
from workloads.tracefile import read_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
AZURE = SHARED / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
VIDUR = SHARED / "vidur" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
needs_shared = pytest.mark.skipif(not AZURE.is_file(), reason="shared/traces is not beside the project")


def kvbench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=cwd, capture_output=True, text=True, timeout=180
    )


def lengths(trace) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.array([r.prompt_len for r in trace.requests]),
        np.array([r.output_len for r in trace.requests]),
    )


@pytest.mark.parametrize(
    ("source", "prompt", "output", "tol"),
    [
        ("fixed:prompt=512,output=128", 512, 128, 0.0),
        ("uniform:prompt=10..30,output=100..300", 20, 200, 0.02),
        ("lognormal:prompt_mean=300,prompt_cv=0.8,output_mean=150,output_cv=0.5", 300, 150, 0.03),
        ("sharegpt-paper", 161.31, 337.99, 0.03),
        ("alpaca-paper", 19.31, 58.45, 0.03),
    ],
)
def test_generated_lengths_match_their_spec(source, prompt, output, tol):
    trace = build_trace(WorkloadSpec(source, num_requests=20_000, arrivals="all"))
    p, o = lengths(trace)
    assert p.mean() == pytest.approx(prompt, rel=tol) and o.mean() == pytest.approx(output, rel=tol)


def test_same_seed_same_trace_other_seed_differs():
    spec = WorkloadSpec("sharegpt-paper", num_requests=300, rate=3.0, arrivals="gamma", burstiness=0.3)
    assert build_trace(spec) == build_trace(spec)
    # only the seed changes: an ignored seed would give the same trace
    other = build_trace(replace(spec, seed=1))
    same = build_trace(spec)
    assert [r.prompt_len for r in other.requests] != [r.prompt_len for r in same.requests]
    assert [r.output_len for r in other.requests] != [r.output_len for r in same.requests]
    assert [r.arrival_s for r in other.requests] != [r.arrival_s for r in same.requests]


def test_empirical_resamples_a_trace_file(tmp_path):
    source = build_trace(WorkloadSpec("fixed:prompt=7,output=9", num_requests=10, arrivals="all"))
    write_trace(source, tmp_path / "t.jsonl")
    trace = build_trace(WorkloadSpec(f"empirical:{tmp_path / 't.jsonl'}", num_requests=50, rate=1.0))
    assert {(r.prompt_len, r.output_len) for r in trace.requests} == {(7, 9)} and len(trace) == 50


@needs_shared
def test_a_file_with_timestamps_is_replayed_windowed_and_scaled():
    full = read_trace(AZURE)
    window = build_trace(WorkloadSpec(str(AZURE), window_start_s=600, window_duration_s=60, time_scale=2))
    first = next(i for i, r in enumerate(full.requests) if r.arrival_s >= 600)
    assert window.requests[0].prompt_len == full.requests[first].prompt_len
    assert window.requests[0].arrival_s == 0.0
    assert window.requests[-1].arrival_s <= 30.0  # 60 s played twice as fast
    stats = trace_stats(window)
    assert stats.mean_rate == pytest.approx(len(window) / 30.0, rel=0.05)
    retimed = build_trace(WorkloadSpec(str(AZURE), num_requests=500, rate=2.0, arrivals="poisson"))
    assert len(retimed) == 500 and retimed.requests[0].prompt_len == full.requests[0].prompt_len


@needs_shared
def test_a_file_without_timestamps_needs_a_rate():
    with pytest.raises(KvbenchError, match="has no timestamps: give --rate R"):
        build_trace(WorkloadSpec(str(VIDUR), num_requests=10))
    with pytest.raises(KvbenchError, match="--arrivals replay: .* has no timestamps"):
        build_trace(WorkloadSpec(str(VIDUR), arrivals="replay"))
    assert len(build_trace(WorkloadSpec(str(VIDUR), num_requests=10, rate=5.0))) == 10


@needs_shared
def test_max_total_len_drops_and_counts():
    trace = build_trace(WorkloadSpec(str(AZURE), max_total_len=8192))
    assert all(r.total_len <= 8192 for r in trace.requests)
    assert trace.meta["dropped_requests"] == 19_366 - len(trace) == 1


def test_chat_turns_are_turn_major_with_history():
    trace = build_trace(
        WorkloadSpec("fixed:prompt=100,output=50", num_requests=6, chat_turns=3, max_history=320, rate=1.0)
    )
    assert [(r.conversation_id, r.turn, r.prompt_len) for r in trace.requests] == [
        ("c0", 0, 100), ("c1", 0, 100), ("c0", 1, 250), ("c1", 1, 250), ("c0", 2, 320), ("c1", 2, 320),
    ]  # fmt: skip
    times = [r.arrival_s for r in trace.requests]
    assert times == sorted(times)


def test_max_total_len_counts_a_turn_with_its_history():
    """Each turn alone is 150 tokens; with the history, turns 1 and 2 reach 300 and 370."""
    spec = WorkloadSpec(
        "fixed:prompt=100,output=50",
        num_requests=6,
        chat_turns=3,
        max_history=320,
        max_total_len=300,
        rate=1.0,
    )
    trace = build_trace(spec)
    assert [(r.conversation_id, r.turn, r.total_len) for r in trace.requests] == [
        ("c0", 0, 150), ("c1", 0, 150), ("c0", 1, 300), ("c1", 1, 300),
    ]  # fmt: skip
    assert trace.meta["dropped_requests"] == 2


def test_sharing_options_are_recorded():
    trace = build_trace(
        WorkloadSpec("fixed:prompt=20,output=5", num_requests=4, prefix="fewshot-5", n=3, rate=1.0)
    )
    assert {(r.prompt_len, r.prefix_len, r.n) for r in trace.requests} == {(361, 341, 3)}
    assert trace.meta["workload"]["prefix"] == "fewshot-5"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (WorkloadSpec("nope"), "unknown --trace 'nope'"),
        (WorkloadSpec("fixed:prompt=3"), "missing output="),
        (WorkloadSpec("uniform:prompt=9..3,output=1..2", rate=1.0), "prompt_min must be <= prompt_max"),
        (WorkloadSpec("fixed:prompt=3,output=0", rate=1.0), "output"),
        (WorkloadSpec("sharegpt-paper", arrivals="bursty"), "unknown --arrivals 'bursty'"),
        (WorkloadSpec("sharegpt-paper", rate=-2.0), "--rate must be positive"),
        (WorkloadSpec("sharegpt-paper", rate=1.0, prefix="many"), "--prefix must be a token count"),
        (WorkloadSpec("sharegpt-paper", rate=1.0, n=0), "--n must be >= 1"),
        (WorkloadSpec("sharegpt-paper", num_requests=0), "--num-requests must be an integer >= 1"),
        (WorkloadSpec("sharegpt:x.json", rate=1.0), "needs --tokenizer"),
    ],
)
def test_bad_specs_name_the_parameter(spec, message):
    with pytest.raises(KvbenchError, match=message):
        build_trace(spec)


def test_trace_cli_make_stats_convert_plot(tmp_path):
    made = kvbench(
        "trace", "make", "alpaca-paper", "--num-requests", "400", "--rate", "8", "--arrivals", "constant",
        "--out", str(tmp_path / "a.jsonl"),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    header = json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0])
    assert header["format"] == "kvbench-trace" and header["version"] == 1
    stats = kvbench("trace", "stats", str(tmp_path / "a.jsonl"))
    assert "requests         400" in stats.stdout and "mean rate        8.00 req/s" in stats.stdout
    assert kvbench("trace", "convert", str(tmp_path / "a.jsonl"), str(tmp_path / "a.csv")).returncode == 0
    assert read_trace(tmp_path / "a.csv") == read_trace(tmp_path / "a.jsonl")
    plotted = kvbench("trace", "plot", str(tmp_path / "a.csv"), "--out", str(tmp_path / "fig.png"))
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "fig.png").stat().st_size > 10_000 and (tmp_path / "fig.svg").is_file()
    run = kvbench(
        "simulate",
        "--engine",
        "orca-oracle",
        "--trace",
        str(tmp_path / "a.csv"),
        "--out",
        str(tmp_path / "r"),
    )
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["completed"] == 400


def test_trace_cli_bad_input_is_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,arrival_s,prompt_len,output_len\n0,0.0,10,5\n1,0.5,12,0\n")
    for args in (
        ("trace", "stats", str(bad)),
        ("trace", "convert", str(bad), str(tmp_path / "out.jsonl")),
        ("simulate", "--engine", "paged", "--trace", str(bad), "--out", str(tmp_path / "run")),
    ):
        proc = kvbench(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.strip() == f"error: {bad}: line 3, column output_len: must be >= 1, got 0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


def test_a_rate_given_with_a_replayed_file_is_refused_not_ignored(tmp_path):
    source = build_trace(WorkloadSpec("fixed:prompt=7,output=9", num_requests=10, rate=2.0))
    write_trace(source, tmp_path / "t.jsonl")  # arrival times: the file is replayed by default
    with pytest.raises(KvbenchError, match=r"--rate 5: .*t.jsonl has timestamps, which are replayed"):
        build_trace(WorkloadSpec(str(tmp_path / "t.jsonl"), rate=5.0))
    drawn = build_trace(WorkloadSpec(str(tmp_path / "t.jsonl"), rate=5.0, arrivals="poisson"))
    replayed = build_trace(WorkloadSpec(str(tmp_path / "t.jsonl")))
    first = source.requests[0].arrival_s  # a replay starts at its first arrival
    recorded = [r.arrival_s - first for r in source.requests]
    assert [r.arrival_s for r in replayed.requests] == pytest.approx(recorded)
    assert [r.arrival_s for r in drawn.requests] != pytest.approx(recorded)
