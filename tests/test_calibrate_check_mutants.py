"""Rules of the held-out check of a calibrated simulation (`kvbench.calibrate.check`) that a
mutation run of that module found unpinned: which held-out runs are *loaded* (a request waited
for admission, `saturated_s` > 0, or the run completed fewer than 0.95 x the arrival rate),
at both edges; the rate a replayed trace's arrival times make; the count within the 10 % target
at exactly 10 %; the median of an even count; which fitted run a dropped held-out run is named
beside; and fitting and held-out sets kept apart.

Every run folder is written by hand (a config.json, a requests.csv where the rule reads one)
and every summary is a dict, so expected values are exact arithmetic, compared with `==`; no
test depends on the machine's speed. docs/MUTATION.md says why such tests exist; the mutants
they kill, and those that are equivalent, are in results/mutation/calibrate-check/.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from kvbench.calibrate.check import (
    LOADED_THROUGHPUT,
    METRICS,
    TARGET,
    Check,
    _spread,
    by_load,
    dropped_note,
    find_runs,
    fit_and_check,
    format_checks,
    format_summary,
    headline,
    is_loaded,
    read_config,
    shared_draw,
    summarize,
)
from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.metrics.summary import Slo
from workloads.spec import WorkloadSpec

TRACE = "uniform:prompt=8..24,output=4..12"


def config(rate: float | None = 20.0, seed: int = 0, num_requests: int = 4, source: str = TRACE) -> RunConfig:
    return RunConfig(
        engine="paged", workload=WorkloadSpec(source, num_requests=num_requests, rate=rate, seed=seed)
    )


def run_folder(folder: Path, cfg: RunConfig, arrivals: list[float] | None = None) -> Path:
    """A run folder holding its config.json, and a requests.csv of `arrivals` when given."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(asdict(cfg)))
    if arrivals is not None:
        lines = ["request_id,arrival_s", *(f"{i},{t}" for i, t in enumerate(arrivals))]
        (folder / "requests.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_the_loaded_share_is_0_95_and_the_target_10_percent():
    assert LOADED_THROUGHPUT == 0.95 and TARGET == 0.10


def test_a_run_completing_exactly_0_95_of_its_rate_without_a_wait_is_unloaded(tmp_path):
    """Loaded means *below* 0.95 x the arrival rate: exactly 0.95 x 20 req/s (19.0, exact in
    binary) is unloaded, the next float below it loaded; `saturated_s` exactly 0 is no wait."""
    cfg = config(rate=20.0)
    assert LOADED_THROUGHPUT * 20.0 == 19.0
    assert is_loaded(tmp_path, {"saturated_s": 0.0, "request_throughput": 19.0}, cfg) is False
    below = float(19.0 - 2**-48)
    assert is_loaded(tmp_path, {"saturated_s": 0.0, "request_throughput": below}, cfg) is True


def test_any_wait_for_admission_loads_a_run_whatever_its_throughput(tmp_path):
    """`saturated_s` > 0: a request waited, so the run is loaded even at its full arrival rate;
    a missing or null `saturated_s` is no wait."""
    cfg = config(rate=20.0)
    assert is_loaded(tmp_path, {"saturated_s": 2**-20, "request_throughput": 20.0}, cfg) is True
    assert is_loaded(tmp_path, {"saturated_s": 1.0, "request_throughput": 40.0}, cfg) is True
    assert is_loaded(tmp_path, {"saturated_s": None, "request_throughput": 20.0}, cfg) is False
    assert is_loaded(tmp_path, {"request_throughput": 20.0}, cfg) is False


def test_a_replayed_trace_is_loaded_against_the_rate_its_arrival_times_make(tmp_path):
    """Without `--rate`, the arrival rate is (requests - 1) / (last arrival - first): five
    requests over 4 s (from 1 s to 5 s) arrive at 1 req/s, so 0.95 req/s is unloaded and
    anything below it loaded."""
    run = run_folder(tmp_path / "replay", config(rate=None), [1.0, 2.0, 3.0, 4.0, 5.0])
    cfg = read_config(run)
    assert cfg.workload.rate is None
    assert is_loaded(run, {"saturated_s": 0.0, "request_throughput": 0.95}, cfg) is False
    assert is_loaded(run, {"saturated_s": 0.0, "request_throughput": 0.9375}, cfg) is True
    assert is_loaded(run, {"saturated_s": 0.5, "request_throughput": 1.0}, cfg) is True


def test_two_requests_make_a_rate_and_one_or_a_burst_makes_none(tmp_path):
    """Two arrivals 2 s apart make 0.5 req/s; a single request, or every request at once, has
    no rate to fall behind: unloaded whatever it completed."""
    two = run_folder(tmp_path / "two", config(rate=None), [0.0, 2.0])
    assert is_loaded(two, {"saturated_s": 0.0, "request_throughput": 0.25}, read_config(two)) is True
    assert is_loaded(two, {"saturated_s": 0.0, "request_throughput": 0.475}, read_config(two)) is False
    one = run_folder(tmp_path / "one", config(rate=None), [3.0])
    assert is_loaded(one, {"saturated_s": 0.0, "request_throughput": 0.0}, read_config(one)) is False
    burst = run_folder(tmp_path / "burst", config(rate=None), [3.0, 3.0, 3.0])
    assert is_loaded(burst, {"saturated_s": 0.0, "request_throughput": 0.0}, read_config(burst)) is False


def test_an_error_of_exactly_10_percent_is_within_the_target():
    """Within 10 % includes 10 %; the median of an even count is the upper middle one."""
    assert _spread([0.10]) == {"runs": 1, "median_abs_error": 0.10, "max_abs_error": 0.10, "within_target": 1}
    assert _spread([0.04, 0.01, 0.10 + 2**-40, 0.02]) == {
        "runs": 4, "median_abs_error": 0.04, "max_abs_error": 0.10 + 2**-40, "within_target": 3,
    }  # fmt: skip
    assert _spread([]) == {"runs": 0, "median_abs_error": None, "max_abs_error": None, "within_target": 0}


def test_a_check_errs_by_simulated_over_real_and_a_zero_real_value_is_no_error():
    """The error is signed, simulated / real - 1; a metric the real run has at 0 gives NaN."""
    assert Check("r", "paged", "mean_ttft_s", 4.0, 5.0).error == 0.25
    assert Check("r", "paged", "mean_ttft_s", 4.0, 3.0).error == -0.25
    assert (
        Check("r", "paged", "mean_ttft_s", 0.0, 3.0).error
        != Check("r", "paged", "mean_ttft_s", 0.0, 3.0).error
    )
    assert Check("r", "paged", "mean_ttft_s", 4.0, 5.0, True).to_dict() == {
        "run": "r", "engine": "paged", "metric": "mean_ttft_s", "real": 4.0, "simulated": 5.0,
        "loaded": True, "error": 0.25,
    }  # fmt: skip


def test_the_summary_splits_by_load_per_metric_and_leaves_out_metrics_nobody_checked():
    """Per metric: all runs, then loaded and unloaded apart (a run of unknown load only in
    the pooled count); a metric without a check has no entry."""
    checks = [
        Check("a", "paged", "normalized_latency_s", 4.0, 5.0, True),  # +25 %
        Check("b", "paged", "normalized_latency_s", 4.0, 4.25, True),  # +6.25 %
        Check("c", "paged", "normalized_latency_s", 8.0, 7.5, False),  # -6.25 %
        Check("d", "paged", "normalized_latency_s", 8.0, 4.0, None),  # -50 %
    ]
    assert summarize(checks) == {
        "normalized_latency_s": {
            "runs": 4, "median_abs_error": 0.25, "max_abs_error": 0.5, "within_target": 2,
            "loaded": {"runs": 2, "median_abs_error": 0.25, "max_abs_error": 0.25, "within_target": 1},
            "unloaded": {"runs": 1, "median_abs_error": 0.0625, "max_abs_error": 0.0625, "within_target": 1},
        }
    }  # fmt: skip


def test_a_dropped_run_is_named_beside_the_first_fitted_run_of_its_draw(tmp_path):
    """Held out means another trace draw (trace and seed): a held-out run of a fitted draw, at
    whatever rate or count, is dropped beside the first fitted run of that draw; another seed,
    or another trace at the same seed, is held out."""
    first = run_folder(tmp_path / "fit" / "a", config(seed=1, rate=20.0))
    second = run_folder(tmp_path / "fit" / "b", config(seed=1, rate=40.0, num_requests=8))
    other = run_folder(tmp_path / "fit" / "c", config(seed=2))
    same = run_folder(tmp_path / "held" / "same", config(seed=1, rate=0.5, num_requests=2))
    seed = run_folder(tmp_path / "held" / "seed", config(seed=3))
    trace = run_folder(tmp_path / "held" / "trace", config(seed=1, source="uniform:prompt=8..16,output=4..8"))
    assert shared_draw([first, second, other], [same, seed, trace]) == [(same, first)]
    assert shared_draw([second, first], [same]) == [(same, second)]
    assert shared_draw([first], [seed, trace]) == []


@pytest.mark.parametrize("loaded", [True, False])
def test_a_run_of_one_load_counts_only_in_its_own_row(loaded):
    """A loaded run's error never lands in the unloaded spread, nor the other way round."""
    mine, other = ("loaded", "unloaded") if loaded else ("unloaded", "loaded")
    summary = summarize([Check("a", "paged", "mean_ttft_s", 4.0, 5.0, loaded)])["mean_ttft_s"]
    assert summary[mine]["runs"] == 1 and summary[other]["runs"] == 0


def test_the_table_of_checks_puts_loaded_runs_first_then_unloaded_then_unknown():
    """Every check, loaded first (they test the fit), then unloaded, then unknown (`?`), each
    group in run order; an absolute run is named by its last two parts, a relative one whole."""
    checks = [
        Check("/x/y/cells/c1", "vllm", "mean_ttft_s", 4.0, 3.0, None),
        Check("fig13/seed-1/idle", "paged", "mean_ttft_s", 8.0, 9.0, False),
        Check("/x/y/fig12/queued", "paged", "mean_ttft_s", 4.0, 5.0, True),
        Check("fig13/other", "paged", "normalized_latency_s", 2.0, 2.0, False),
    ]
    assert format_checks(checks).split("\n") == [
        "| run | engine | load | metric | real | simulated | error |",
        "|---|---|---|---|---:|---:|---:|",
        "| fig12/queued | paged | loaded | mean_ttft_s | 4 | 5 | +25.0 % |",
        "| fig13/seed-1/idle | paged | unloaded | mean_ttft_s | 8 | 9 | +12.5 % |",
        "| fig13/other | paged | unloaded | normalized_latency_s | 2 | 2 | +0.0 % |",
        "| cells/c1 | vllm | ? | mean_ttft_s | 4 | 3 | -25.0 % |",
    ]


CHECKS = [
    Check("a", "paged", "output_token_throughput", 4.0, 5.0, True),  # +25 %
    Check("b", "paged", "output_token_throughput", 4.0, 4.25, False),  # +6.25 %
    Check("c", "paged", "output_token_throughput", 4.0, 2.0, None),  # -50 %
    Check("a", "paged", "normalized_latency_s", 8.0, 8.5, True),  # +6.25 %
]


def test_the_headline_counts_loaded_runs_within_10_percent_per_metric():
    """Per metric, loaded runs within 10 % of the loaded runs, then the unloaded ones; metrics
    apart by "; "; a metric without an unloaded run says 0 of 0."""
    assert headline(CHECKS) == (
        "output_token_throughput 0 of 1 loaded runs within 10 % (1 of 1 unloaded); "
        "normalized_latency_s 1 of 1 loaded runs within 10 % (0 of 0 unloaded)"
    )


def test_the_held_out_summary_opens_with_the_headline_and_a_row_per_load_and_metric():
    """The whole opening of a held-out report: the headline, what loaded means (0.95 x the
    arrival rate), then every loaded row before any unloaded one, and the runs of unknown load
    said to be in neither."""
    assert format_summary(CHECKS).split("\n") == [
        "Headline: output_token_throughput 0 of 1 loaded runs within 10 % (1 of 1 unloaded); "
        "normalized_latency_s 1 of 1 loaded runs within 10 % (0 of 0 unloaded).",
        "",
        "Loaded: a request waited for admission, or the run completed below 0.95 x its arrival rate. "
        "Unloaded: its throughput is the arrival rate whatever the step times, so its error says little "
        "of the fit.",
        "",
        "| load | metric | runs | within 10 % | median abs. error | largest abs. error |",
        "|---|---|---:|---:|---:|---:|",
        "| loaded | output_token_throughput | 1 | 0 | 25.0 % | 25.0 % |",
        "| loaded | normalized_latency_s | 1 | 1 | 6.2 % | 6.2 % |",
        "| unloaded | output_token_throughput | 1 | 1 | 6.2 % | 6.2 % |",
        "| unloaded | normalized_latency_s | 0 | 0 | - | - |",
        "",
        "1 runs of unknown load are counted in neither row.",
    ]
    assert format_summary(CHECKS[:2])[-1] == "|"  # every run's load known: no closing line


def test_a_summary_written_before_the_split_gives_no_run_for_either_load():
    """`by_load` of an older pooled summary: each load with no run, never the pooled spread."""
    old = {"mean_ttft_s": {"runs": 3, "median_abs_error": 0.01, "max_abs_error": 0.02, "within_target": 3}}
    assert by_load(old) == [("loaded", "mean_ttft_s", {"runs": 0}), ("unloaded", "mean_ttft_s", {"runs": 0})]


def test_the_dropped_note_names_each_run_beside_its_fitted_twin():
    dropped = [(Path("/r/held/a"), Path("/r/fit/x")), (Path("/r/held/b"), Path("/r/fit/y"))]
    assert dropped_note(dropped, name=lambda run: run.name) == (
        "dropped 2 held-out runs with a fitted run's trace and seed, so its requests: a (as x), b (as y)"
    )
    assert dropped_note(dropped[:1]) == (
        "dropped 1 held-out runs with a fitted run's trace and seed, so its requests: /r/held/a (as /r/fit/x)"
    )


def _bare_run(folder: Path, steps: bool = True) -> Path:
    folder.mkdir(parents=True)
    for name in ("summary.json", "config.json", *(("steps.csv",) if steps else ())):
        (folder / name).write_text("{}")
    return folder


def test_find_runs_names_what_a_run_folder_needs_and_refuses_a_run_named_twice(tmp_path):
    """Every run each path names, in order; a path with none is refused naming the files a run
    needs (steps.csv too when the fit reads steps); a run named twice, or by a folder and one
    holding it, is refused naming both."""
    a, b = _bare_run(tmp_path / "r" / "a"), _bare_run(tmp_path / "r" / "b")
    stepless = _bare_run(tmp_path / "s" / "c", steps=False)
    assert find_runs([a, b], steps=True, flag="--fit") == [a, b]
    assert find_runs([tmp_path / "r", tmp_path / "s"], steps=False, flag="--held-out") == [a, b, stepless]
    with pytest.raises(KvbenchError) as error:
        find_runs([tmp_path / "s"], steps=True, flag="--fit")
    assert str(error.value) == (
        f"--fit {tmp_path / 's'}: no kvbench run folder (steps.csv, summary.json and config.json) "
        "there or below"
    )
    with pytest.raises(KvbenchError) as error:
        find_runs([tmp_path / "none"], steps=False, flag="--held-out")
    assert str(error.value) == (
        f"--held-out {tmp_path / 'none'}: no kvbench run folder (summary.json and config.json) there or below"
    )
    with pytest.raises(KvbenchError) as error:
        find_runs([a, str(a)], steps=True, flag="--held-out")
    assert str(error.value) == f"--held-out: run folder {a} is named twice"
    with pytest.raises(KvbenchError) as error:
        find_runs([tmp_path / "r", b], steps=True, flag="--held-out")
    assert str(error.value) == f"--held-out: run folder {b} is named by {tmp_path / 'r'} and by {b}"


def test_a_config_without_slo_or_percentiles_reads_with_their_defaults_and_bad_ones_are_one_line(tmp_path):
    cfg = config()
    data = asdict(cfg)
    del data["slo"], data["percentiles"]
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data | {"unknown_setting": 1}))
    assert read_config(folder) == replace(cfg, slo=Slo(), percentiles=())
    full = replace(cfg, slo=Slo(ttft_s=0.5, tpot_s=0.125), percentiles=(50.0, 99.0))
    (folder / "config.json").write_text(json.dumps(asdict(full)))
    assert read_config(folder) == full
    for text, message in (
        ("{", f"{folder}: cannot read config.json (JSONDecodeError)"),
        ("[1]", f"{folder}/config.json: not a kvbench run config (not a JSON object)"),
        ("{}", f"{folder}/config.json: not a kvbench run config ('workload')"),
    ):
        (folder / "config.json").write_text(text)
        with pytest.raises(KvbenchError) as error:
            read_config(folder)
        assert str(error.value) == message


TRUE = dict(cost_fixed_s=0.0125, cost_per_token_s=2**-15, cost_per_kv_token_s=2**-21)


def _simulated_real_run(folder: Path, rate: float, seed: int, costs: dict) -> Path:
    """A simulated run priced by `costs`, relabelled a real one (the check takes real runs only)."""
    from kvbench.simulate import simulate, write_result

    workload = WorkloadSpec("sharegpt-paper", num_requests=40, rate=rate, seed=seed)
    write_result(simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0, **costs)), folder)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps(summary | {"mode": "real"}))
    return folder


def test_fit_and_check_replays_held_out_runs_with_the_fit_alone_and_writes_their_summary(tmp_path):
    """The fit goes to a folder made for it; a held-out run is simulated with the fitted file,
    never with its own recorded cost flags (here another model, twice as slow per step), and
    its checks, their engine and their summary are what `fit_and_check` returns and writes.
    Nothing dropped: no `held_out_dropped`; no engine fits unless asked."""
    from kvbench.simulate import simulate

    fit = _simulated_real_run(tmp_path / "fit", 6.0, 0, TRUE)
    held = _simulated_real_run(tmp_path / "held", 12.0, 7, TRUE | {"cost_fixed_s": 0.025})
    out = tmp_path / "new" / "deeper" / "cost.json"
    done = fit_and_check([fit], [held], out)
    assert done.dropped == [] and done.calibration.engines == {} and done.calibration.runs == (str(fit),)
    expected = simulate(replace(
        read_config(held), cost_model=str(out), device="cpu", cost_fixed_s=None, cost_per_token_s=None,
        cost_per_kv_token_s=None,
    )).summary  # fmt: skip
    real = json.loads((held / "summary.json").read_text())
    assert [(c.run, c.engine, c.metric, c.real, c.simulated) for c in done.checks] == [
        (str(held), "paged", m, float(real[m]), float(expected[m])) for m in METRICS
    ]
    assert all(c.loaded == is_loaded(held, real, read_config(held)) for c in done.checks)
    written = json.loads(out.read_text())
    assert "held_out_dropped" not in written
    assert written["held_out"] == [c.to_dict() for c in done.checks]
    assert written["held_out_summary"] == summarize(done.checks)
    alone = fit_and_check([fit], [], tmp_path / "alone" / "cost.json")
    assert alone.checks == [] and alone.dropped == [] and alone.calibration == done.calibration
    assert "held_out" not in json.loads((tmp_path / "alone" / "cost.json").read_text())


def test_a_real_run_recorded_with_the_triton_kernels_on_cuda_is_checked(tmp_path, monkeypatch):
    """A held-out run made on the GPU with `--attention triton` is replayed on the cpu device, where
    no kernel runs: its recorded attention setting must not refuse the replay (it did, after the
    fit was written), and the check is the one of the same run recorded with the default. (Outside
    Triton's interpreter, which the test suite turns on and a user's replay does not.)"""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fit = _simulated_real_run(tmp_path / "fit", 6.0, 0, TRUE)
    held = _simulated_real_run(tmp_path / "held", 12.0, 7, TRUE)
    plain = fit_and_check([fit], [held], tmp_path / "plain" / "cost.json").checks
    recorded = json.loads((held / "config.json").read_text())
    (held / "config.json").write_text(json.dumps(recorded | {"attention": "triton", "device": "cuda"}))
    assert read_config(held).attention == "triton"
    gpu = fit_and_check([fit], [held], tmp_path / "gpu" / "cost.json").checks
    assert [(c.metric, c.real, c.simulated) for c in gpu] == [(c.metric, c.real, c.simulated) for c in plain]
    assert len(gpu) == len(METRICS)


def test_a_replayed_trace_without_arrival_times_or_within_a_second_is_judged_as_it_is(tmp_path):
    """No requests.csv (or no `arrival_s`): no rate to fall behind, unloaded. Two arrivals half
    a second apart make 2 req/s, so 1 req/s completed is loaded: a span under 1 s is a rate too."""
    bare = run_folder(tmp_path / "bare", config(rate=None))
    assert is_loaded(bare, {"saturated_s": 0.0, "request_throughput": 0.0}, read_config(bare)) is False
    fast = run_folder(tmp_path / "fast", config(rate=None), [0.25, 0.75])
    assert is_loaded(fast, {"saturated_s": 0.0, "request_throughput": 1.0}, read_config(fast)) is True
    assert is_loaded(fast, {"saturated_s": 0.0, "request_throughput": 1.9}, read_config(fast)) is False


def test_a_held_out_summary_of_the_wrong_shape_is_refused_naming_its_file(tmp_path):
    """Before anything is fitted, a held-out run's summary.json is checked and named in the error."""
    held = _bare_run(tmp_path / "held")
    (held / "summary.json").write_text(json.dumps({"mode": "real", "mean_ttft_s": "soon"}))
    with pytest.raises(KvbenchError) as error:
        fit_and_check([tmp_path / "fit"], [held], tmp_path / "cost.json")
    assert str(error.value) == f"{held}/summary.json: 'mean_ttft_s' must be a number, got \"soon\""
    assert not (tmp_path / "cost.json").exists()


def test_fit_and_check_fits_with_the_objective_it_is_given(tmp_path):
    """`objective` reaches the fit: on noisy step rows (every third step 1.5 x as long) the
    absolute objective's constants are `calibrate`'s with it, not the default's."""
    import pandas as pd

    from kvbench.calibrate.fit import calibrate

    fit = _simulated_real_run(tmp_path / "fit", 6.0, 0, TRUE)
    steps = pd.read_csv(fit / "steps.csv")
    steps.loc[steps.index % 3 == 0, "duration_s"] *= 1.5
    steps.to_csv(fit / "steps.csv", index=False)
    done = fit_and_check([fit], [], tmp_path / "cost.json", objective="absolute")
    assert done.calibration == calibrate([fit], objective="absolute") != calibrate([fit])


def test_a_held_out_replay_of_a_trace_file_is_judged_by_its_own_arrival_times(tmp_path):
    """A held-out run replaying a trace file's timestamps (no `--rate`) is loaded or not by
    the rate its requests.csv makes: the check reads that run's own folder."""
    from kvbench.simulate import simulate, write_result

    trace = tmp_path / "trace.jsonl"
    header = {"format": "kvbench-trace", "version": 1, "name": "t", "source": "t", "hash_block_size": None,
              "meta": {}}  # fmt: skip
    rows = [{"request_id": i, "arrival_s": i / 8, "prompt_len": 64, "output_len": 16} for i in range(8)]
    trace.write_text("\n".join(json.dumps(line) for line in [header, *rows]) + "\n")
    held = tmp_path / "held"
    workload = WorkloadSpec(str(trace), seed=5)
    write_result(simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0, **TRUE)), held)
    summary = json.loads((held / "summary.json").read_text())
    (held / "summary.json").write_text(json.dumps(summary | {"mode": "real"}))
    assert read_config(held).workload.rate is None
    fit = _simulated_real_run(tmp_path / "fit", 6.0, 0, TRUE)
    done = fit_and_check([fit], [held], tmp_path / "cost.json")
    loaded = is_loaded(held, summary | {"mode": "real"}, read_config(held))
    assert [c.metric for c in done.checks] == list(METRICS) and {c.loaded for c in done.checks} == {loaded}
