"""Metrics on hand-made request tables with known answers, on real runs, and through the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvbench.config import RunConfig, prepare
from kvbench.errors import KvbenchError
from kvbench.metrics.latency import ItlTable, distribution
from kvbench.metrics.summary import (
    RequestRecord,
    Slo,
    format_slo,
    goodput,
    latency_summary,
    parse_percentiles,
    parse_slo,
    request_record,
)
from kvbench.requests import Request
from kvbench.sequence import Sequence
from kvbench.simulate import simulate
from tests.test_cli import kvbench, read_csv
from workloads.spec import WorkloadSpec


def record(rid: int, ttft: float, e2el: float, output_len: int, arrival: float = 0.0) -> RequestRecord:
    """A finished request, admitted on arrival, its first token `ttft` and its last `e2el`
    seconds after it, the others evenly between: the row the engine's record builder makes."""
    seq = Sequence(Request(rid, arrival, 10, output_len))
    seq.advance(1, arrival + ttft, arrival)
    if output_len > 1:
        ends = np.linspace(arrival + ttft, arrival + e2el, output_len)[1:]
        seq.advance(output_len - 1, arrival + e2el, arrival + ttft, ends=ends)
    return request_record(seq)


# --- distributions ---------------------------------------------------------------------------


def test_distribution_of_four_values():
    d = distribution("x_s", [4.0, 1.0, 3.0, 2.0], [50, 90, 99])
    assert d["mean_x_s"] == 2.5 and d["median_x_s"] == 2.5 and d["p50_x_s"] == 2.5
    assert d["std_x_s"] == pytest.approx(math.sqrt(1.25))  # population std
    assert d["p90_x_s"] == pytest.approx(3.7)  # rank 2.7: 3 + 0.7 x (4 - 3)
    assert d["p99_x_s"] == pytest.approx(3.97)


def test_distribution_leaves_out_undefined_values():
    d = distribution("tpot_s", [math.nan, 1.0, 3.0], [100])
    assert (d["mean_tpot_s"], d["median_tpot_s"], d["p100_tpot_s"]) == (2.0, 2.0, 3.0)
    empty = distribution("tpot_s", [math.nan], [99.9])
    assert set(empty) == {"mean_tpot_s", "median_tpot_s", "std_tpot_s", "p99.9_tpot_s"}
    assert all(math.isnan(v) for v in empty.values())


def test_weighted_distribution_is_the_expanded_one():
    # values 3, 1, 2 occurring 2, 1, 3 times: the pool is 1 2 2 2 3 3
    d = distribution("x", [3.0, 1.0, 2.0], [50, 90], counts=np.array([2, 1, 3]))
    assert d["median_x"] == 2.0
    assert d["p90_x"] == 3.0  # rank 4.5 lies between the two 3s
    assert d["mean_x"] == pytest.approx(13 / 6)
    rng = np.random.default_rng(0)
    values, counts = rng.exponential(size=300), rng.integers(1, 6, size=300)
    pool = np.repeat(values, counts)
    d = distribution("x", values, [1, 25, 50, 90, 99, 99.9, 100], counts)
    for q in (1, 25, 50, 90, 99, 99.9, 100):
        assert d[f"p{q:g}_x"] == pytest.approx(np.percentile(pool, q), rel=1e-12)
    assert d["std_x"] == pytest.approx(pool.std(), rel=1e-12)


# --- inter-token latencies -------------------------------------------------------------------


def test_itl_of_sequences_sharing_a_segment():
    # a and b are prefilled alone, then decode three steps together (one shared `ends` array);
    # a is then preempted and gets its last token much later; c has a single token
    a, b, c = (Sequence(Request(i, 0.0, 4, n)) for i, n in ((0, 5), (1, 4), (2, 1)))
    a.advance(1, 1.0, 0.0, ends=np.array([1.0]))
    b.advance(1, 1.5, 1.0, ends=np.array([1.5]))
    shared = np.array([2.0, 3.5, 4.0])
    a.advance(3, 4.0, 1.5, ends=shared)
    b.advance(3, 4.0, 1.5, ends=shared)
    a.advance(1, 10.0, 9.0, ends=np.array([10.0]))
    c.advance(1, 2.0, 0.0, ends=np.array([2.0]))
    table = ItlTable.of([a, b, c])
    assert sorted(table.expanded()) == [0.5, 0.5, 0.5, 1.0, 1.5, 1.5, 6.0]
    assert table.num_gaps == (5 - 1) + (4 - 1) + 0
    assert list(table.maxima[:2]) == [6.0, 1.5] and math.isnan(table.maxima[2])
    assert a.token_times.tolist() == [1.0, 2.0, 3.5, 4.0, 10.0]
    rec = request_record(a, table.maxima[0])
    assert rec.max_itl_s == 6.0 and rec.tpot_s == pytest.approx((10.0 - 1.0) / 4)


@pytest.mark.parametrize("engine", ["paged", "orca-oracle", "static"])
def test_itl_of_a_real_run_equals_each_requests_token_gaps(engine):
    # 2 GiB of KV for OPT-13B (2,621 slots): paged preempts, static runs one request at a time
    config = RunConfig(engine, workload=WorkloadSpec(num_requests=60, rate=20.0, seed=1), kv_cache_gib=2.0)
    result = simulate(config)
    seqs = result.run.sequences
    if engine == "paged":
        assert result.summary["num_preemptions"] > 0
    gaps = [np.diff(seq.token_times) for seq in seqs]
    for seq, g, rec in zip(seqs, gaps, result.requests, strict=True):
        assert len(g) == seq.request.output_len - 1 and (g > 0).all()
        assert seq.token_times[0] == rec.first_token_s and seq.token_times[-1] == rec.finish_s
        assert g.sum() == pytest.approx(rec.tpot_s * (rec.output_len - 1))
        assert rec.max_itl_s == g.max()
    pool = np.concatenate(gaps)
    s = result.summary
    assert s["mean_itl_s"] == pytest.approx(pool.mean())
    for q in (50, 90, 99):
        assert s[f"p{q}_itl_s"] == pytest.approx(np.percentile(pool, q))
    tpots = [rec.tpot_s for rec in result.requests]
    assert s["p99_tpot_s"] == pytest.approx(np.percentile(tpots, 99))
    assert s["median_ttft_s"] == pytest.approx(np.median([rec.ttft_s for rec in result.requests]))


# --- goodput ---------------------------------------------------------------------------------


def test_goodput_counts_requests_meeting_every_slo():
    done = [
        record(0, ttft=0.2, e2el=2.2, output_len=11),  # tpot 0.2
        record(1, ttft=0.5, e2el=1.4, output_len=10),  # tpot 0.1: exactly on the bound meets it
        record(2, ttft=1.5, e2el=2.0, output_len=6),  # ttft misses
        record(3, ttft=0.1, e2el=0.1, output_len=1),  # no tpot: cannot miss it
    ]
    out = goodput(done, Slo(ttft_s=1.0, tpot_s=0.1), makespan=8.0)
    assert out["good_requests"] == 2 and out["goodput"] == 2 / 8 and out["goodput_fraction"] == 0.5
    assert out["slo"] == {"ttft_s": 1.0, "tpot_s": 0.1}
    assert goodput(done, Slo(e2el_s=2.0), makespan=8.0)["good_requests"] == 3
    summary = latency_summary(done, ItlTable.of([]), 8.0, (50, 99.9), Slo(e2el_s=2.0))
    assert summary["goodput"] == 3 / 8 and "p99.9_e2el_s" in summary and "p90_e2el_s" not in summary
    assert "goodput" not in latency_summary(done, ItlTable.of([]), 8.0)


# --- options ---------------------------------------------------------------------------------


def test_parse_options():
    assert parse_percentiles("99, 50,90") == (50.0, 90.0, 99.0)
    assert parse_percentiles("99.9,100") == (99.9, 100.0)
    slo = parse_slo("ttft=0.5, e2el=20")
    assert slo == Slo(ttft_s=0.5, e2el_s=20.0) and parse_slo(format_slo(slo)) == slo
    assert parse_slo(None) == parse_slo("") == Slo()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("itl=1", "--slo: unknown metric 'itl'; choose from ttft, tpot, e2el"),
        ("ttft=-1", "--slo ttft must be a positive number of seconds, got -1.0"),
        ("ttft=0", "--slo ttft must be a positive number"),
        ("tpot=inf", "--slo tpot must be a positive number"),
        ("ttft=abc", "--slo ttft: 'abc' is not a number of seconds"),
        ("ttft", "--slo: expected metric=seconds"),
        ("ttft=1,ttft=2", "--slo: ttft is given twice"),
    ],
)
def test_bad_slo(text, message):
    with pytest.raises(KvbenchError) as error:
        parse_slo(text)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "--percentiles must be in (0, 100], got 0"),
        ("50,101", "--percentiles must be in (0, 100], got 101"),
        ("nan", "--percentiles must be in (0, 100], got nan"),
        ("fifty", "--percentiles: 'fifty' is not a number"),
        ("50,", "--percentiles: '' is not a number"),
        ("99, 50,90,50", "--percentiles: 50 is given twice"),
        ("90,90.0", "--percentiles: 90.0 (the same as 90) is given twice"),
    ],
)
def test_bad_percentiles(text, message):
    with pytest.raises(KvbenchError) as error:
        parse_percentiles(text)
    assert str(error.value).startswith(message)


def test_prepare_refuses_bad_metric_options_in_a_config():
    with pytest.raises(KvbenchError, match=r"--percentiles must be in \(0, 100\], got 0"):
        prepare(RunConfig("paged", percentiles=(0.0,)))
    with pytest.raises(KvbenchError, match="--slo e2el must be a positive number"):
        prepare(RunConfig("paged", slo=Slo(e2el_s=-2.0)))


# --- the CLI ---------------------------------------------------------------------------------


def test_simulate_writes_percentiles_and_goodput(tmp_path):
    out = tmp_path / "run"
    proc = kvbench(
        "simulate", "--engine", "paged", "--num-requests", "40", "--rate", "4", "--kv-cache-gib", "2",
        "--percentiles", "50,99.9", "--slo", "ttft=0.5,tpot=0.05", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "goodput:" in proc.stdout
    s = json.loads((out / "summary.json").read_text())
    for metric in ("ttft", "tpot", "itl", "e2el", "queueing"):
        for stat in ("mean", "median", "std", "p50", "p99.9"):
            assert f"{stat}_{metric}_s" in s
        assert f"p99_{metric}_s" not in s
    rows = read_csv(out / "requests.csv")
    good = sum(float(r["ttft_s"]) <= 0.5 and float(r["tpot_s"]) <= 0.05 for r in rows)
    assert s["good_requests"] == good and s["goodput_fraction"] == good / 40
    assert s["goodput"] == pytest.approx(good / s["makespan_s"])
    config = json.loads((out / "config.json").read_text())
    assert config["percentiles"] == [50.0, 99.9] and config["slo"]["tpot_s"] == 0.05


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--slo", "itl=1"), "--slo: unknown metric 'itl'"),
        (("--slo", "ttft=-0.5"), "--slo ttft must be a positive number of seconds, got -0.5"),
        (("--slo", "e2el=soon"), "--slo e2el: 'soon' is not a number of seconds"),
        (("--percentiles", "0,50"), "--percentiles must be in (0, 100], got 0"),
        (("--percentiles", "150"), "--percentiles must be in (0, 100], got 150"),
        (("--percentiles", "p99"), "--percentiles: 'p99' is not a number"),
    ],
)
def test_bad_metric_flags_are_one_line_errors(tmp_path, args, message):
    out = tmp_path / "x"
    proc = kvbench("simulate", "--engine", "paged", "--num-requests", "5", *args, "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not out.exists()
