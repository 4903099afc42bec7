"""Rules of `kvbench.reproduce.sweeps` and `kvbench.reproduce.engines` that the figure tests left
unpinned (survivors of results/mutation/reproduce-figures): where Figure 13 finds Figure 2's runs,
which rates a resumed real sweep keeps, where the calibrated simulation places real runs, how a
preemption's milliseconds are priced, and Figure 19's verdicts on assumed cost terms, missing
cells and the order at block size 1.

Each test calls the real function on small hand-made inputs, or on a few simulated cells of a
few requests (no wall-clock reading anywhere).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from kvbench.paper import FIG19_RECOMPUTE_MS, FIG19_SWAP_MS
from kvbench.reproduce.engines import shared_fig2
from kvbench.reproduce.rows import Options, Row, Setting
from kvbench.reproduce.sweeps import (
    FIG19_E2E_METRIC,
    FIG19_METRIC,
    PLACED_SPREAD,
    POWERS,
    _fig19_end_to_end,
    _fig19_overheads,
    _over,
    _ratio,
    _rested,
    _slower,
    already_placed,
    bracket_at,
    fig19,
    fig19_block_sizes,
    placed_rates,
    preemption_overhead_ms,
    prompt_tokens,
    sweep,
)
from kvbench.reproduce.verdicts import DIFFERS, MATCHES, NOT_MEASURED, Interval, Verdict

TRACE = "sharegpt-paper"


def test_figure_13_of_a_seed_reads_figure_2_of_the_same_seed():
    """Figure 13's ShareGPT runs are Figure 2's: `<out>/fig13/seed-<s>` reads `<out>/fig2/seed-<s>`
    (and a single-seed `<out>/fig13` reads `<out>/fig2`)."""
    assert shared_fig2(Path("out") / "fig13" / "seed-3") == Path("out") / "fig2" / "seed-3"
    assert shared_fig2(Path("out") / "fig13") == Path("out") / "fig2"


def test_a_resumed_sweep_keeps_the_rates_its_sweep_json_recorded(tmp_path):
    """`already_placed`: the engine rates in sweep.json's axes, as floats, where they name exactly
    the sweep's engines; none recorded, or other engines, is no placement (placed afresh)."""
    assert already_placed(tmp_path, ("paged",)) is None  # no sweep.json yet
    recorded = {"axes": {"engine_rates": [["paged", [1.5, 2]], ["orca-oracle", [0.5, 0.75]]]}}
    (tmp_path / "sweep.json").write_text(json.dumps(recorded))
    placed = already_placed(tmp_path, ("orca-oracle", "paged"))
    assert placed == {"paged": (1.5, 2.0), "orca-oracle": (0.5, 0.75)}
    assert all(isinstance(v, float) for pair in placed.values() for v in pair)
    assert already_placed(tmp_path, ("paged",)) is None  # fewer engines than recorded
    assert already_placed(tmp_path, ("paged", "orca-oracle", "orca-max")) is None  # more
    (tmp_path / "sweep.json").write_text(json.dumps({"axes": {"rates": [1.0, 2.0]}}))
    assert already_placed(tmp_path, ("paged",)) is None  # a grid sweep: no placement recorded


def test_fig19_block_sizes_are_the_grids_the_verdicts_expect():
    """Figure 19 runs 1, 4, 16, 64 and 256 quick, 1, 16 and 256 quick on a GPU, every power of two
    in a full run."""
    assert fig19_block_sizes(Options(True, Setting())) == (1, 4, 16, 64, 256)
    assert fig19_block_sizes(Options(True, Setting(real=True))) == (1, 16, 256)
    assert fig19_block_sizes(Options(False, Setting())) == POWERS


def test_bracket_at_is_none_where_no_rate_passed():
    """`bracket_at`: no rate under the bound is no bracket (None), not (None, first fail)."""
    cells = [{"engine": "paged", "rate": r, "status": "ok", "normalized_latency_s": 0.5} for r in (1.0, 2.0)]
    assert bracket_at(cells, "paged", 0.1) is None
    assert bracket_at(cells, "paged", 1.0) == (2.0, math.inf)


def _overhead_rows(by_how: dict[str, dict[int, float]]) -> list[Row]:
    return [
        Row("fig19", f"paged-{how}", TRACE, f"overhead_ms_per_preemption@bs{bs}", ms)
        for how, by in by_how.items()
        for bs, ms in by.items()
    ]


PAPER_MS = {"swap": dict(FIG19_SWAP_MS), "recompute": dict.fromkeys(FIG19_SWAP_MS, FIG19_RECOMPUTE_MS)}


def _by_mode(verdicts: list[Verdict]) -> dict[str, list[Verdict]]:
    return {how: [v for v in verdicts if v.metric.startswith(FIG19_METRIC.format(how))] for how in PAPER_MS}


@pytest.mark.parametrize(
    ("assumed", "rested", "term"),
    [
        ("per_swap_block_s", "swap", "per_swap_block_s"),
        ("per_prefill_token_s", "recompute", "per_prefill_token_s"),
        ("per_token_s", "recompute", "per_token_s"),
    ],
)
def test_a_simulated_overhead_on_an_assumed_term_is_not_measured(assumed, rested, term):
    """Simulated overheads at the paper's own milliseconds match, except the mode whose price is an
    assumed cost term (swap: per_swap_block_s; recompute: its token costs): "not measured", and
    the verdict names the term."""
    verdicts = _by_mode(_fig19_overheads(_overhead_rows(PAPER_MS), frozenset({assumed}), False))
    for how, own in verdicts.items():
        assert len(own) == len(FIG19_SWAP_MS)
        if how == rested:
            assert all(v.outcome == NOT_MEASURED for v in own), own
            assert all(v.evidence.endswith(f"rests on an assumed cost term {term}") for v in own)
        else:
            assert all(v.outcome == MATCHES for v in own), own
    fitted = _fig19_overheads(_overhead_rows(PAPER_MS), frozenset({"fixed_s"}), False)
    assert [v.outcome for v in fitted] == [MATCHES] * 2 * len(FIG19_SWAP_MS)


def test_an_overhead_never_measured_is_missing_and_named():
    """A block size the paper gives without a preemption measured there is a missing measurement
    ("differs"), its verdict naming the mode and block size and saying why."""
    rows = _overhead_rows({"swap": {1: 137.0, 16: 40.0}, "recompute": PAPER_MS["recompute"]})
    (gone,) = [v for v in _fig19_overheads(rows, frozenset(), False) if v.outcome != MATCHES]
    assert gone.outcome == DIFFERS
    assert gone.metric == f"{FIG19_METRIC.format('swap')} at block size 256"
    assert gone.evidence == "no measurement: no preemption measured at this block size"


def _latency_rows(by_how: dict[str, dict[int, float]]) -> list[Row]:
    return [
        Row("fig19", f"paged-{how}", TRACE, f"normalized_latency_s@bs{bs}", v)
        for how, by in by_how.items()
        for bs, v in by.items()
    ]


def test_end_to_end_on_an_assumed_term_is_not_measured_at_every_block_size():
    """Swap over recompute end to end on runs resting on an assumed term: "not measured" at the
    comparable block sizes as at block size 1, the term named."""
    rows = _latency_rows({"swap": {1: 0.2, 16: 0.1}, "recompute": {1: 0.1, 16: 0.1}})
    verdicts = _fig19_end_to_end(rows, (1, 16, 256), "cost term fixed_s")
    assert [v.outcome for v in verdicts] == [NOT_MEASURED, NOT_MEASURED]
    assert all(v.evidence.endswith("rests on an assumed cost term fixed_s") for v in verdicts)
    assert [v.outcome for v in _fig19_end_to_end(rows, (1, 16, 256), None)] == [MATCHES, MATCHES]


def test_end_to_end_with_one_mode_missing_is_a_missing_measurement():
    """A block size where one mode has no finished run is "no measurement", not a ratio."""
    rows = _latency_rows({"swap": {16: 0.1}, "recompute": {1: 0.1, 16: 0.1}})
    first, level = _fig19_end_to_end(rows, (1, 16, 256), None)
    assert first.outcome == DIFFERS and first.metric == f"{FIG19_E2E_METRIC} at block size 1"
    assert first.evidence == "no measurement: a mode without a finished run at this block size"
    assert level.outcome == MATCHES


def test_over_passes_an_assumed_term_to_its_verdict():
    """`_over`: a ratio resting on an assumed term is "not measured", the term named."""
    verdict = _over("x", Interval(2.0, 2.0, 2.0), Interval(2.0, 2.0, 2.0), 1.0, "cost term fixed_s")
    assert verdict.outcome == NOT_MEASURED and verdict.evidence.endswith("an assumed cost term fixed_s")
    assert _over("x", Interval(2.0, 2.0, 2.0), Interval(2.0, 2.0, 2.0), 1.0).outcome == MATCHES


def test_a_ratio_of_seeds_over_one_run_is_not_measured():
    """`_ratio`: seeds on one side only (the other one run) give no ratio: "not measured"."""
    seeds = Interval(1.0, 0.9, 1.1, (0.9, 1.1))
    one = Interval(2.0, 2.0, 2.0)
    for numerator, denominator in ((seeds, one), (one, seeds)):
        verdict = _ratio("x", numerator, denominator)
        assert isinstance(verdict, Verdict) and verdict.outcome == NOT_MEASURED
    assert _ratio("x", one, one) == ("x, one run", Interval(1.0, 1.0, 1.0))


def test_swap_slower_at_block_size_1_needs_a_ratio_wholly_above_1():
    """`_slower`: swap over recompute matches the paper's order only with its interval's low end
    above 1; a tie (exactly 1) differs. Every verdict is order only, an unmeasured one too."""
    tie = _slower("x", Interval(2.0, 2.0, 2.0), Interval(2.0, 2.0, 2.0), None)
    assert tie.outcome == DIFFERS and tie.order_only
    slower = _slower("x", Interval(2.2, 2.2, 2.2), Interval(2.0, 2.0, 2.0), None)
    assert slower.outcome == MATCHES and slower.order_only
    mixed = _slower("x", Interval(1.0, 0.9, 1.1, (0.9, 1.1)), Interval(2.0, 2.0, 2.0), None)
    assert mixed.outcome == NOT_MEASURED and mixed.order_only
    assert str(mixed).startswith("not measured (order only): x")


def test_an_order_resting_on_an_assumed_term_is_not_measured_and_says_so():
    """`_rested`: with an assumed term the verdict is "not measured", its evidence extended by
    the term; without one it is the verdict unchanged."""
    verdict = Verdict(MATCHES, "m", "kvbench 1.5", order_only=True)
    assert _rested(verdict, None) is verdict
    rested = _rested(verdict, "cost term per_swap_block_s")
    assert rested == Verdict(
        NOT_MEASURED, "m", "kvbench 1.5; rests on an assumed cost term per_swap_block_s", order_only=True
    )


# a cost file pricing a prefill token apart from a decode row, as a calibrated model may
COSTS = {"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-4, "per_prefill_token_s": 4e-4,
         "per_kv_token_s": 1e-6, "per_swap_block_s": 1e-4}  # fmt: skip


def _cell(tmp_path: Path, name: str, *, kv: float, preemption: str = "recompute", requests: int = 40) -> Path:
    """One simulated paged cell of `requests` ShareGPT requests at 2 req/s under COSTS."""
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(COSTS))
    options = Options(True, Setting(cost_model=str(cost)), num_requests=requests)
    result = sweep(options, tmp_path / name, engines=("paged",), trace=TRACE, rates=(2.0,), block_sizes=(16,),
                   kv=kv, preemption=preemption)  # fmt: skip
    (row,) = [r for r in result.rows if r["role"] != "baseline"]
    assert row["status"] == "ok"
    return tmp_path / name / "cells" / row["cell_id"]


def _steps(cell: Path) -> list[dict]:
    with open(cell / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


def _recomputed_tokens(cell: Path) -> float:
    with open(cell / "requests.csv", newline="") as f:
        prompts = sum(float(r["prompt_len"]) for r in csv.DictReader(f))
    return sum(float(s["num_tokens"]) for s in _steps(cell) if s["kind"] == "prefill") - prompts


def test_a_recomputed_token_is_priced_as_a_prefill_token_and_no_preemption_is_no_overhead(tmp_path):
    """Recompute's overhead per preemption: the prefill tokens beyond the prompts times the cost
    of a PREFILL token (`per_prefill_token_s`, not a decode row's), over the preemptions; a cell
    that never preempted has no overhead (None), not 0 ms."""
    cell = _cell(tmp_path, "tight", kv=3.0, requests=80)
    count = json.loads((cell / "summary.json").read_text())["num_preemptions"]
    assert count > 0 and _recomputed_tokens(cell) > 0
    expected = 1e3 * _recomputed_tokens(cell) * COSTS["per_prefill_token_s"] / count
    assert preemption_overhead_ms(cell, "recompute") == pytest.approx(expected, rel=1e-9)
    roomy = _cell(tmp_path, "roomy", kv=12.0, requests=5)
    assert json.loads((roomy / "summary.json").read_text())["num_preemptions"] == 0
    assert preemption_overhead_ms(roomy, "recompute") is None
    assert preemption_overhead_ms(roomy, "swap") is None


def test_a_real_cells_overhead_is_priced_by_constants_fitted_to_its_own_steps(tmp_path):
    """A real cell's constants are fitted to its own steps (`kvbench calibrate` on the one run),
    never read from its config (which carries the cost model it was configured with): the same
    steps with the config's constants scaled 10x give the same overhead."""
    import shutil

    from kvbench.calibrate.fit import calibrate

    simulated = _cell(tmp_path, "tight", kv=3.0, requests=80)
    real = shutil.copytree(simulated, tmp_path / "real")
    summary = json.loads((real / "summary.json").read_text())
    (real / "summary.json").write_text(json.dumps({**summary, "mode": "real"}))
    config = json.loads((real / "config.json").read_text())
    config["cost_model_constants"] = {
        k: v * 10 if isinstance(v, float) else v for k, v in config["cost_model_constants"].items()
    }
    (real / "config.json").write_text(json.dumps(config))
    fitted = calibrate([real]).cost.per_token(prefill=True)
    assert fitted > 0
    expected = 1e3 * _recomputed_tokens(real) * fitted / summary["num_preemptions"]
    assert preemption_overhead_ms(real, "recompute") == pytest.approx(expected, rel=1e-9)


def test_prompt_tokens_are_the_requests_files_where_it_is_kept(tmp_path):
    """`prompt_tokens`: requests.csv's prompt lengths where the run kept that file (its trace is
    rebuilt from the config only where requests.csv was left out)."""
    cell = _cell(tmp_path, "roomy", kv=12.0, requests=5)
    with open(cell / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert prompt_tokens(cell) == sum(float(r["prompt_len"]) for r in rows)
    for r in rows:
        r["prompt_len"] = str(int(r["prompt_len"]) + 1)  # one token more each: no longer the trace's
    with open(cell / "requests.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert prompt_tokens(cell) == sum(float(r["prompt_len"]) for r in rows)


def test_figure_19_without_preemptions_counts_none_and_notes_its_scaled_rate(tmp_path):
    """Figure 19 at a rate far below what the budget serves (rate scale 0.05: 0.1 req/s): every
    cell's preemptions row is 0 (not 1) and its overhead None, the overhead plot is skipped with a
    note, and the figure's note gives the rate actually run, the paper's 2 req/s times the scale."""
    options = Options(True, Setting(rate_scale=0.05), num_requests=4)
    result = fig19(options, tmp_path)
    preemptions = [r for r in result.rows if r.metric.startswith("preemptions@bs")]
    overheads = [r for r in result.rows if r.metric.startswith("overhead_ms_per_preemption@bs")]
    assert len(preemptions) == len(overheads) == 2 * 5
    assert {r.kvbench for r in preemptions} == {0.0} and {r.kvbench for r in overheads} == {None}
    assert "overhead: fewer than two block sizes preempted" in result.notes
    assert result.notes[-1].startswith(
        "3 GiB of KV (0.25 of the setting's) at 0.1 req/s so that paged preempts"
    )


def _placed(tmp_path: Path, threshold: float, count: int) -> tuple[dict, list[dict], list[dict], dict]:
    """`placed_rates` of paged on tiny-opt's CPU cost file under a fixed bound (no baselines)."""
    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps({"model": "tiny-opt", "fixed_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6})
    )
    setting = Setting(
        "tiny-opt", 0.01, 1.0, real=True, paper_threshold=False, device="cpu", placement=str(cost)
    )
    folder = tmp_path / "sharegpt-paper.placement"
    placed = placed_rates(Options(True, setting, seed=6), folder, count=count, engines=("paged",),
                          trace=TRACE, rates=(1.0, 8.0, 64.0), block_sizes=(16,), kv=0.01,
                          threshold=threshold)  # fmt: skip
    with open(folder / "sustained.csv", newline="") as f:
        sustained = list(csv.DictReader(f))
    with open(folder / "sweep.csv", newline="") as f:
        cells = list(csv.DictReader(f))
    return placed, sustained, cells, json.loads((folder / "sweep.json").read_text())


def _digits(rate: float) -> float:
    return float(f"{rate:.4g}")


def test_real_runs_are_placed_either_side_of_the_middle_of_the_simulated_bracket(tmp_path):
    """With a pass and a fail found, the real runs go to the bracket's midpoint divided and
    multiplied by PLACED_SPREAD (4 significant digits); the simulation runs the count of requests
    the real cells run (not the figure's own default), as a simulation recorded so."""
    placed, (row,), cells, recorded = _placed(tmp_path, threshold=0.015, count=20)
    low, high = float(row["last_pass_rate"]), float(row["first_fail_rate"])
    assert low < high  # both ends found: the rule under test
    centre = (low + high) / 2
    assert placed == {"paged": (_digits(centre / PLACED_SPREAD), _digits(centre * PLACED_SPREAD))}
    assert cells and {c["completed"] for c in cells} == {"20"}
    assert recorded["mode"] == "simulated" and recorded["cell_run"]["real"] is False


def test_an_engine_failing_every_simulated_rate_is_placed_below_its_first_fail(tmp_path):
    """An engine the simulation saw fail down to its lowest rate (no pass) is no error: its pair
    is centred at the first fail divided by PLACED_SPREAD, so the upper real run is at the fail."""
    placed, (row,), _, _ = _placed(tmp_path, threshold=1e-6, count=3)
    assert not row["last_pass_rate"] and row["first_fail_rate"]
    fail = float(row["first_fail_rate"])
    centre = fail / PLACED_SPREAD
    assert placed == {"paged": (_digits(centre / PLACED_SPREAD), _digits(centre * PLACED_SPREAD))}
