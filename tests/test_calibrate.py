"""`kvbench calibrate`: the fit recovers a known cost model, and simulate uses the fitted file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.calibrate.fit import calibrate, load_cost_model
from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.simulate import simulate, write_result
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
TRUE = dict(cost_fixed_s=0.012, cost_per_token_s=4e-5, cost_per_kv_token_s=3e-7)


def simulated(tmp_path: Path, name: str, rate: float, seed: int, **extra) -> Path:
    """A run whose step times come exactly from the cost model TRUE (swap preemption included)."""
    workload = WorkloadSpec("sharegpt-paper", num_requests=150, rate=rate, seed=seed)
    config = RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0, **TRUE, **extra)
    write_result(simulate(config), tmp_path / name)
    return tmp_path / name


def test_the_fit_recovers_the_cost_model_that_made_the_steps(tmp_path):
    runs = [simulated(tmp_path, "a", 4.0, 0), simulated(tmp_path, "b", 30.0, 1, preemption="swap")]
    rows = [json.loads((run / "summary.json").read_text()) for run in runs]
    assert rows[1]["num_preemptions"] > 0  # swaps happened, so their term is identifiable
    fitted = calibrate(runs, simulated_ok=True)  # a known model: only a simulation has one
    assert fitted.cost.fixed_s == pytest.approx(TRUE["cost_fixed_s"], rel=1e-6)
    assert fitted.cost.per_token_s == pytest.approx(TRUE["cost_per_token_s"], rel=1e-6)
    assert fitted.cost.per_kv_token_s == pytest.approx(TRUE["cost_per_kv_token_s"], rel=1e-6)
    assert fitted.p90_relative_error < 1e-6 and fitted.model == "opt-13b"


def test_simulate_with_the_fitted_model_reproduces_a_held_out_run(tmp_path):
    fitted_on = simulated(tmp_path, "fit", 6.0, 0)
    held_out = simulated(tmp_path, "held", 12.0, 7)
    model = tmp_path / "cost.json"
    done = subprocess.run(  # the command fits real runs only
        [sys.executable, "-m", "kvbench", "calibrate", str(fitted_on), "--out", str(model)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {fitted_on}: a simulated run"), done.stderr
    assert not model.exists()
    model.write_text(json.dumps(calibrate([fitted_on], simulated_ok=True).to_dict()))
    workload = WorkloadSpec("sharegpt-paper", num_requests=150, rate=12.0, seed=7)
    again = simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0, cost_model=str(model)))
    truth = json.loads((held_out / "summary.json").read_text())
    assert again.summary["normalized_latency_s"] == pytest.approx(truth["normalized_latency_s"], rel=1e-6)
    assert again.summary["request_throughput"] == pytest.approx(truth["request_throughput"], rel=1e-6)


def test_calibration_errors_are_one_line(tmp_path):
    with pytest.raises(KvbenchError, match="not a kvbench run folder"):
        calibrate([tmp_path])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "llama-1b-ref", "fixed_s": 1}))
    with pytest.raises(KvbenchError, match="fitted on llama-1b-ref, not on --model opt-13b"):
        load_cost_model(str(bad), "opt-13b")
    bad.write_text("{")
    with pytest.raises(KvbenchError, match="cannot read it"):
        load_cost_model(str(bad), "opt-13b")


def test_the_fit_recovers_a_prefill_only_cost(tmp_path):
    """Real runners prefill eagerly and replay decodes as graphs: a prefill step costs more."""
    truth = {"model": "opt-13b", "fixed_s": 0.012, "per_token_s": 4e-5, "per_kv_token_s": 3e-7,
             "per_prefill_s": 0.02}  # fmt: skip
    model = tmp_path / "truth.json"
    model.write_text(json.dumps(truth))
    run = simulated(tmp_path, "prefill", 8.0, 3, cost_model=str(model))
    fitted = calibrate([run], simulated_ok=True).cost
    assert fitted.per_prefill_s == pytest.approx(0.02, rel=1e-6)
    assert fitted.fixed_s == pytest.approx(0.012, rel=1e-6)
    assert load_cost_model(str(model), "opt-13b").per_prefill_s == 0.02


def test_the_fit_prices_prefill_tokens_and_decode_rows_apart(tmp_path):
    """A decode row costs a real runner more than a prompt token (sampling, small GEMMs): a
    model with both, and an old file with one token cost, each come back as written."""
    truth = {"model": "opt-13b", "fixed_s": 0.002, "per_token_s": 1.2e-5, "per_kv_token_s": 7e-8,
             "per_prefill_s": 0.01, "per_prefill_token_s": 3e-6}  # fmt: skip
    model = tmp_path / "truth.json"
    model.write_text(json.dumps(truth))
    workload = WorkloadSpec("alpaca-paper", num_requests=200, rate=40.0, seed=5)
    run = tmp_path / "two-costs"
    write_result(simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0,
                                    cost_model=str(model))), run)  # fmt: skip
    fitted = calibrate([run], simulated_ok=True).cost
    assert fitted.per_token_s == pytest.approx(1.2e-5, rel=1e-6)
    assert fitted.per_prefill_token_s == pytest.approx(3e-6, rel=1e-6)
    assert fitted.per_token(prefill=True) == pytest.approx(3e-6, rel=1e-6)
    assert fitted.per_prefill_s == pytest.approx(0.01, rel=1e-6)
    old = {key: value for key, value in truth.items() if key != "per_prefill_token_s"}
    model.write_text(json.dumps(old))
    loaded = load_cost_model(str(model), "opt-13b")
    assert loaded.per_prefill_token_s is None and loaded.per_token(prefill=True) == 1.2e-5


def test_held_out_real_runs_are_replayed_by_the_simulator(tmp_path):
    """`--held-out`: a real run's config is rebuilt exactly, simulated with the fit, compared."""
    from kvbench.calibrate.check import check, read_config, summarize
    from kvbench.real.run import run_real

    workload = WorkloadSpec("uniform:prompt=8..24,output=4..12", num_requests=6, rate=50.0, seed=2)
    # the PyTorch attention: what is checked is the config's round trip and the check, not the kernels
    config = RunConfig(engine="paged", model="tiny-llama", workload=workload, kv_cache_gib=0.01, block_size=4,
                       attention="torch")  # fmt: skip
    write_result(run_real(config), tmp_path / "real")
    assert read_config(tmp_path / "real") == config
    model = tmp_path / "cost.json"
    # the step's core constants pinned: fitted to one tiny run's wall-clock steps on a loaded CPU,
    # they may all clamp to 0, a cost file the loader rightly refuses ("a step must take time")
    pinned = {"fixed_s": 1e-3, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}
    fitted = calibrate([tmp_path / "real"]).to_dict() | pinned
    model.write_text(json.dumps(fitted))
    checks = check(model, [tmp_path / "real"])
    assert [c.metric for c in checks] == ["output_token_throughput", "normalized_latency_s", "mean_ttft_s"]
    assert all(c.real > 0 and c.simulated > 0 for c in checks)
    assert summarize(checks)["normalized_latency_s"]["runs"] == 1
    with pytest.raises(KvbenchError, match="not a real run"):
        check(model, [simulated(tmp_path, "sim", 4.0, 0)])


def test_a_cost_file_refitted_in_place_is_a_changed_setting(tmp_path):
    """Resuming reruns a run whose cost file changed under the same path: its constants would
    otherwise be the old file's while its config named the new one."""
    from kvbench.sweep.cell import config_differences

    model = tmp_path / "cost.json"
    fitted = {"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}
    model.write_text(json.dumps(fitted))
    workload = WorkloadSpec("alpaca-paper", num_requests=20, rate=10.0, seed=1)
    config = RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0, cost_model=str(model))
    write_result(simulate(config), tmp_path / "run")
    assert config_differences(config, tmp_path / "run") == []
    model.write_text(json.dumps(fitted | {"held_out": [], "held_out_summary": {}}))  # errors beside the fit
    assert config_differences(config, tmp_path / "run") == []
    model.write_text(json.dumps(fitted | {"fixed_s": 0.02}))
    assert config_differences(config, tmp_path / "run") == ["cost_model"]


def test_calibrate_takes_folders_of_runs_and_holds_out_others(tmp_path):
    """`kvbench calibrate FOLDER --held-out FOLDER`: the runs below each folder, fitted or replayed."""
    fit, held = tmp_path / "fit", tmp_path / "held"
    simulated(fit, "a", 6.0, 0)
    simulated(fit / "deeper", "b", 9.0, 1)
    simulated(held, "c", 12.0, 7)
    for run in (fit / "a", fit / "deeper" / "b", held / "c"):  # what real runs say of themselves
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps(summary | {"mode": "real"}))
    model = tmp_path / "cost.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "calibrate", str(fit), "--held-out", str(held),
         "--out", str(model)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads(model.read_text())
    assert written["runs"] == [str(fit / "a"), str(fit / "deeper" / "b")]
    assert [c["run"] for c in written["held_out"]] == [str(held / "c")] * 3  # throughput, latency, TTFT
    # the held-out run was made by the constants the fit recovers: replayed with the fit, it matches
    assert written["held_out_summary"]["normalized_latency_s"]["max_abs_error"] < 1e-6
    assert written["held_out_summary"]["normalized_latency_s"]["within_target"] == 1
    assert written["fixed_s"] == pytest.approx(TRUE["cost_fixed_s"], rel=1e-6)


def test_a_held_out_copy_of_a_fitted_run_is_dropped(tmp_path):
    """A reproduction copies runs between figures: a copy's error would be the fit's own."""
    import shutil

    from kvbench.calibrate.check import fit_and_check

    fitted = simulated(tmp_path, "fit", 6.0, 0)
    copy, other = tmp_path / "copy", simulated(tmp_path, "other", 12.0, 7)
    shutil.copytree(fitted, copy)
    for run in (fitted, copy, other):  # the fit takes real runs only
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps(summary | {"mode": "real"}))
    done = fit_and_check([fitted], [copy, other], tmp_path / "cost.json")
    assert done.dropped == [(copy, fitted)] and {c.run for c in done.checks} == {str(other)}
    written = json.loads((tmp_path / "cost.json").read_text())
    assert written["held_out_dropped"] == [{"run": str(copy), "shares_draw_with": str(fitted),
                                            "trace": "sharegpt-paper", "seed": 0, "num_requests": 150,
                                            "rate": 6.0}]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("EMPTY",), "kvbench calibrate {tmp}/empty: no kvbench run folder"),
        (("FIT", "--held-out", "EMPTY"), "--held-out {tmp}/empty: no kvbench run folder"),
        (("FIT", "--held-out", "FIT"), "--held-out {tmp}/fit/a: a run cannot be both fitted and held out"),
        (("FIT", "--held-out", "EMPTY", "FIT"), "--held-out: {tmp}/fit follows it, and would be fitted"),
        (("FIT", "--held-out", "SIM"), "--held-out {tmp}/sim/b: not a real run (mode 'simulated')"),
        (("FIT", "--objective", "median"), "--objective median: not one of mean, relative, absolute"),
        # an option's value after --held-out is not a stray run to fit
        (
            ("FIT", "--held-out", "EMPTY", "--objective", "relative"),
            "--held-out {tmp}/empty: no kvbench run folder",
        ),
    ],
)
def test_calibrate_folder_errors_are_one_line(tmp_path, args, message):
    simulated(tmp_path / "fit", "a", 6.0, 0)
    simulated(tmp_path / "sim", "b", 6.0, 1)
    (tmp_path / "empty").mkdir()
    paths = {"EMPTY": str(tmp_path / "empty"), "FIT": str(tmp_path / "fit"), "SIM": str(tmp_path / "sim")}
    # in this process (typer's runner, as tests/test_outputs.py runs commands): the error line and
    # exit code are the command's; a fresh interpreter per case only added its start-up
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    done = CliRunner().invoke(
        app, ["calibrate", *(paths.get(a, a) for a in args), "--out", str(tmp_path / "cost.json")]
    )
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], done.stderr
    assert "Traceback" not in done.output


def test_a_fit_that_prices_a_step_at_nothing_is_refused_and_the_earlier_file_kept(tmp_path):
    """Steps whose measured time does not grow with their batch or context fit 0 for every core
    constant: a file every simulation refuses to price ("a step must take time"). The command
    refuses it in one line before writing, so a good fit already at --out survives."""
    import csv

    from typer.testing import CliRunner

    from kvbench.cli.app import app

    good, free = simulated(tmp_path, "good", 6.0, 0), simulated(tmp_path, "free", 6.0, 1)
    workload = WorkloadSpec("sharegpt-paper", num_requests=150, rate=6.0, seed=2)
    orca = tmp_path / "orca"
    write_result(simulate(RunConfig(engine="orca-oracle", workload=workload, kv_cache_gib=2.0, **TRUE)), orca)
    for run in (good, free, orca):  # what real runs say of themselves
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps(summary | {"mode": "real"}))
    for run in (free, orca):
        with (run / "steps.csv").open() as f:
            rows = list(csv.DictReader(f))
        with (run / "steps.csv").open("w", newline="") as f:  # every step measured at 0 s
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(row | {"duration_s": "0"} for row in rows)
    out = tmp_path / "cost.json"
    done = CliRunner().invoke(app, ["calibrate", str(good), "--out", str(out)])
    assert done.exit_code == 0, done.output
    before = out.read_bytes()
    assert json.loads(before)["fixed_s"] == pytest.approx(TRUE["cost_fixed_s"], rel=1e-6)
    for args in ([str(free)], [str(free), "--by-engine"]):
        done = CliRunner().invoke(app, ["calibrate", *args, "--out", str(out)])
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == 2 and len(lines) == 1, done.output
        assert "the fit of every run" in lines[0] and "prices a step at 0 s" in lines[0], lines
        assert out.read_bytes() == before  # the earlier fit is not replaced by a free one
    # one engine's free steps: the fit of every run prices steps, orca-oracle's own fit does not
    done = CliRunner().invoke(app, ["calibrate", str(good), str(orca), "--by-engine", "--out", str(out)])
    assert done.exit_code == 2 and "the fit of orca-oracle" in done.stderr, done.output
    assert out.read_bytes() == before
