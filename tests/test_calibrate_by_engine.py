"""`kvbench calibrate --by-engine`: each engine's runs fitted alone, and its simulations priced so.

Engines that decode the same batch cost differently on a GPU (paged attention reads K/V through
block tables, a contiguous engine does not); one fit of both prices neither. Here two engines'
steps come from two known cost models: a fit by engine recovers each, the pooled fit neither,
and a held-out run of each is replayed exactly only with its engine's own fit."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvbench.calibrate.fit import (
    calibrate,
    cost_file_digest,
    load_cost_model,
    priced,
    priced_over_measured,
    read_rows,
)
from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.simulate import simulate, write_result
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
# per engine, the constants its simulated steps are made of: paged's decode rows and K/V reads dearer
TRUE = {
    "paged": dict(cost_fixed_s=0.008, cost_per_token_s=6e-5, cost_per_kv_token_s=4e-7),
    "orca-oracle": dict(cost_fixed_s=0.008, cost_per_token_s=1.5e-5, cost_per_kv_token_s=4e-8),
}


def run(folder: Path, engine: str, rate: float, seed: int, *, real: bool = False) -> Path:
    """A run of `engine` whose steps come exactly from TRUE[engine] (marked real when `real`, as
    a real run says of itself, for the command, which fits real runs only)."""
    workload = WorkloadSpec("sharegpt-paper", num_requests=120, rate=rate, seed=seed)
    config = RunConfig(engine=engine, workload=workload, kv_cache_gib=2.0, **TRUE[engine])
    out = folder / f"{engine}-{rate:g}-{seed}"
    write_result(simulate(config), out)
    if real:
        summary = json.loads((out / "summary.json").read_text())
        (out / "summary.json").write_text(json.dumps(summary | {"mode": "real"}))
    return out


def test_a_fit_by_engine_recovers_each_engines_constants_and_the_pooled_fit_neither(tmp_path):
    runs = [run(tmp_path, engine, rate, 0) for engine in TRUE for rate in (4.0, 12.0)]
    fitted = calibrate(runs, simulated_ok=True, by_engine=True)
    assert sorted(fitted.engines) == ["orca-oracle", "paged"]
    for engine, truth in TRUE.items():
        own = fitted.engines[engine]
        assert own.cost.per_token_s == pytest.approx(truth["cost_per_token_s"], rel=1e-6)
        assert own.cost.per_kv_token_s == pytest.approx(truth["cost_per_kv_token_s"], rel=1e-6)
        assert own.cost.fixed_s == pytest.approx(truth["cost_fixed_s"], rel=1e-6)
        assert own.p90_relative_error < 1e-6
        assert list(own.runs) == [str(r) for r in runs if r.name.startswith(f"{engine}-")]
    assert fitted.p90_relative_error > 0.01  # one set of constants for both describes neither
    assert sorted(fitted.engines) == sorted(fitted.to_dict()["engines"])
    assert not calibrate(runs, simulated_ok=True).engines  # without by_engine: the pooled fit alone


def test_a_file_fitted_by_engine_prices_each_engine_with_its_own_fit(tmp_path):
    runs = [run(tmp_path, engine, 6.0, 0) for engine in TRUE]
    model = tmp_path / "cost.json"
    written = calibrate(runs, simulated_ok=True, by_engine=True).to_dict()
    model.write_text(json.dumps(written))
    for engine, truth in TRUE.items():
        loaded = load_cost_model(str(model), "opt-13b", engine)
        assert loaded.per_token_s == pytest.approx(truth["cost_per_token_s"], rel=1e-6)
    pooled = load_cost_model(str(model), "opt-13b", "static")  # no fit of its own: every run's
    assert pooled.per_token_s == pytest.approx(written["per_token_s"])
    assert load_cost_model(str(model), "opt-13b") == pooled
    # a held-out run of orca-oracle, replayed with the file, is its own cost model's run
    held = run(tmp_path, "orca-oracle", 14.0, 3)
    workload = WorkloadSpec("sharegpt-paper", num_requests=120, rate=14.0, seed=3)
    again = simulate(
        RunConfig(engine="orca-oracle", workload=workload, kv_cache_gib=2.0, cost_model=str(model))
    )
    truth = json.loads((held / "summary.json").read_text())
    assert again.summary["normalized_latency_s"] == pytest.approx(truth["normalized_latency_s"], rel=1e-6)


def test_a_refit_of_one_engine_is_a_changed_cost_file_and_bad_sections_are_one_line(tmp_path):
    model = tmp_path / "cost.json"
    base = {"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}
    model.write_text(json.dumps(base))
    plain = cost_file_digest(str(model))
    model.write_text(json.dumps(base | {"engines": {}}))  # no engine's fit: it prices as before
    assert cost_file_digest(str(model)) == plain
    own = {"paged": base | {"per_token_s": 2e-5}}
    model.write_text(json.dumps(base | {"engines": own}))
    by_engine = cost_file_digest(str(model))
    assert by_engine != plain
    model.write_text(json.dumps(base | {"engines": {"paged": own["paged"] | {"runs": ["x"], "rows": 3}}}))
    assert cost_file_digest(str(model)) == by_engine  # what the fit was made of does not price
    model.write_text(json.dumps(base | {"engines": {"paged": own["paged"] | {"per_token_s": 3e-5}}}))
    assert cost_file_digest(str(model)) not in (plain, by_engine)
    model.write_text(json.dumps(base | {"engines": ["paged"]}))
    with pytest.raises(KvbenchError, match=r"'engines' must map engine names to fits, got \[\"paged\"\]"):
        load_cost_model(str(model), "opt-13b", "paged")
    model.write_text(json.dumps(base | {"engines": {"paged": base | {"per_token_s": -1}}}))
    with pytest.raises(
        KvbenchError, match=r"\(its fit of paged\): 'per_token_s' must be a finite number >= 0"
    ):
        load_cost_model(str(model), "opt-13b", "paged")
    assert load_cost_model(str(model), "opt-13b", "orca-oracle").per_token_s == 1e-5  # the pooled fit


def test_calibrate_by_engine_replays_each_engines_held_out_runs_with_its_own_fit(tmp_path):
    fit, held = tmp_path / "fit", tmp_path / "held"
    for engine in TRUE:
        run(fit, engine, 5.0, 0, real=True)
        run(fit, engine, 12.0, 1, real=True)
        run(held, engine, 9.0, 7, real=True)

    def calibrate_command(*flags: str) -> dict:
        out = tmp_path / f"cost{len(flags)}.json"
        done = subprocess.run(
            [sys.executable, "-m", "kvbench", "calibrate", str(fit), "--held-out", str(held),
             "--out", str(out), *flags],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        if flags:
            assert "\n  paged: fixed 8.000 ms/step, 60.000 us/decode row" in done.stdout, done.stdout
            assert done.stdout.count("assumed, no run measured it: per_swap_block_s") == 1  # said once
        return json.loads(out.read_text())

    pooled, own = calibrate_command(), calibrate_command("--by-engine")
    assert "engines" not in pooled
    assert own["engines"]["paged"]["runs"] == [str(fit / "paged-12-1"), str(fit / "paged-5-0")]
    assert own["held_out_summary"]["normalized_latency_s"]["max_abs_error"] < 1e-6
    assert pooled["held_out_summary"]["normalized_latency_s"]["max_abs_error"] > 0.01


def test_a_fit_by_engine_names_its_runs_as_the_fit_of_every_run_does(tmp_path):
    """A reproduction names runs relative to its folder (`base`) so that its files name its own
    runs wherever it moves: each engine's fit too."""
    from kvbench.calibrate.check import fit_and_check

    runs = [run(tmp_path / "fit", engine, 6.0, 0, real=True) for engine in TRUE]
    written = fit_and_check(runs, [], tmp_path / "cost.json", base=tmp_path, by_engine=True).calibration
    assert written.runs == ("fit/paged-6-0", "fit/orca-oracle-6-0")
    assert {engine: fit.runs for engine, fit in written.engines.items()} == {
        "paged": ("fit/paged-6-0",),
        "orca-oracle": ("fit/orca-oracle-6-0",),
    }
    saved = json.loads((tmp_path / "cost.json").read_text())
    assert saved["engines"]["orca-oracle"]["runs"] == ["fit/orca-oracle-6-0"]


def test_an_engine_with_too_few_rows_of_its_own_is_named(tmp_path):
    """The fit of every run has rows enough; one engine's alone may not, and the error says which."""
    runs = [run(tmp_path, engine, 6.0, 0) for engine in TRUE]
    steps = runs[1] / "steps.csv"  # orca-oracle's: three rows left
    steps.write_text("\n".join(steps.read_text().splitlines()[:4]) + "\n")
    assert calibrate(runs, simulated_ok=True).rows > 100
    said = rf"too few to fit \d constants \(--by-engine: the runs of orca-oracle, {runs[1]} first\)$"
    with pytest.raises(KvbenchError, match=said):
        calibrate(runs, simulated_ok=True, by_engine=True)


def test_a_run_is_priced_by_its_engines_section_as_its_steps_ran(tmp_path):
    """`priced` adds a run's rows up as a cost file's section prices them: each engine's own fit
    gives its run's measured time, the fit of both engines' runs misses each (one dearer, one
    cheaper), which is what a page reads as a run's service rate against its fit."""
    runs = [run(tmp_path, engine, rate, 0) for engine in TRUE for rate in (4.0, 12.0)]
    written = calibrate(runs, simulated_ok=True, by_engine=True).to_dict()
    off = []
    for path in runs:
        rows = read_rows(path, simulated_ok=True)
        own = priced(rows, written["engines"][rows.engine])  # [R]
        assert own == pytest.approx(rows.durations, rel=1e-6)
        assert priced_over_measured(rows, written["engines"][rows.engine]) == pytest.approx(
            {"all": 1.0, "decode": 1.0, "prefill": 1.0}, rel=1e-6
        )
        off.append(priced(rows, written).sum() / rows.durations.sum() - 1)
    assert max(off) > 0.01 and min(off) < -0.01


def test_a_section_without_a_prefill_token_price_charges_a_decode_rows_and_padding_must_agree(tmp_path):
    """As the simulator does (`CostModel.per_token`): a fit of runs without prefill rows writes no
    prompt-token price, and a prompt token then costs a decode row's; a term a section lacks
    costs nothing. A run whose decode rows count graph buckets is not priced by a fit of runs
    whose rows did not, nor the other way round: their decode tokens count different rows."""
    rows = read_rows(run(tmp_path, "paged", 6.0, 0), simulated_ok=True)
    prefill = rows.counts[:, 4] > 0  # [R]
    section = {"per_token_s": 1e-4, "per_prefill_token_s": None, "knee_batch": None}
    cost = priced(rows, section)  # [R]
    assert prefill.any() and cost[prefill] == pytest.approx(1e-4 * rows.counts[prefill, 5])
    assert cost[~prefill] == pytest.approx(1e-4 * rows.counts[~prefill, 1])
    with pytest.raises(KvbenchError, match="did not replay CUDA graphs priced by a fit of runs that did"):
        priced(rows, {**section, "pads_decode": True})
    # the sums by kind: prompt tokens priced as decode rows, so decode rows at their own share
    ratios = priced_over_measured(rows, section)
    assert ratios["prefill"] == pytest.approx(cost[prefill].sum() / rows.durations[prefill].sum())
    assert ratios["decode"] == pytest.approx(cost[~prefill].sum() / rows.durations[~prefill].sum())
    decode_only = replace(rows, counts=rows.counts[~prefill], durations=rows.durations[~prefill],
                          batch=rows.batch[~prefill])  # fmt: skip
    assert math.isnan(priced_over_measured(decode_only, section)["prefill"])
