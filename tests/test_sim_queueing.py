"""Why the calibrated simulator overstated Orca engines' queueing near their knee, pinned.

The simulator's schedule is a function of the step durations alone (`kvbench.calibrate.replay`):
a real run's step durations, replayed through the simulator's engine loop, rebuild the run row
for row and its summary, so the queueing errors are errors in step times, not in admission,
prefill batching or reservations; a replay whose step times lead elsewhere says where it left.

One error in step times was the cost model's: a GPU runner replays decode steps from CUDA
graphs of bucketed batch sizes, and a fit that counted the batch rather than the rows that ran
overpriced large batches (results/reference/calibration-opt13b/orca-queueing.md). A padded model
prices the graph's rows, and the fit counts a graphed run's rows so.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from kvbench.calibrate.replay import recorded_rows, replay
from kvbench.config import RunConfig
from kvbench.results.files import read_json
from kvbench.simulate import simulate, write_result
from workloads.spec import WorkloadSpec

METRICS = ("output_token_throughput", "normalized_latency_s", "mean_ttft_s", "mean_queueing_s")


def tiny(engine: str, **extra) -> RunConfig:
    """tiny-opt with 2,048 slots (1 MiB): 40 requests of up to 24 + 64 tokens, all arrived
    within the first step, queue for memory under every engine (orca-max reserves the model's
    2,048 tokens: one request at a time). Simulations price a step at 1 ms and more."""
    workload = WorkloadSpec("uniform:prompt=8..24,output=16..64", num_requests=40, rate=1e5, seed=3)
    return RunConfig(engine=engine, model="tiny-opt", workload=workload, kv_cache_gib=2**20 / 2**30,
                     attention="torch", **extra)  # fmt: skip


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """A real orca-oracle run of tiny-opt on the CPU: wall-clock step times, a queue for memory."""
    from kvbench.real.run import run_real

    out = tmp_path_factory.mktemp("queueing") / "real"
    write_result(run_real(tiny("orca-oracle")), out)
    return out


def test_a_real_runs_durations_replayed_rebuild_its_schedule_and_queueing(real_run):
    summary = read_json(real_run / "summary.json")
    assert summary["mode"] == "real" and summary["saturated_s"] > 0  # requests waited for memory
    rows = recorded_rows(real_run)
    assert any(row.kind == "prefill" and row.batch_size > 1 for row in rows)  # prompts batched on admission
    done = replay(real_run)
    assert done.divergence is None and done.rows == len(rows)
    for metric in METRICS:
        assert math.isclose(done.summary[metric], summary[metric], rel_tol=1e-9), metric
    assert done.summary["num_preemptions"] == summary["num_preemptions"]


@pytest.mark.parametrize("engine", ["static", "orca-max", "orca-pow2", "orca-oracle", "paged"])
def test_every_paper_engine_replays_its_own_simulation_exactly(engine, tmp_path):
    out = tmp_path / engine
    write_result(simulate(tiny(engine, cost_fixed_s=1e-3)), out)
    summary = read_json(out / "summary.json")
    assert summary["mean_queueing_s"] > 0  # requests waited (for memory, or for a prefill step)
    done = replay(out)
    assert done.divergence is None and done.rows == len(recorded_rows(out))
    assert [done.summary[m] for m in METRICS] == pytest.approx([summary[m] for m in METRICS], rel=1e-9)


@pytest.mark.parametrize("vmm_map", ["sync", "ahead"])
def test_a_vmm_simulation_replays_exactly_mapping_ahead_or_not(vmm_map, tmp_path):
    """Mapping ahead reserves pages that hold admissions back: the replay reserves them too."""
    out = tmp_path / vmm_map
    write_result(simulate(tiny("vmm", cost_fixed_s=1e-3, vmm_map=vmm_map, vmm_page_kib=4)), out)
    summary = read_json(out / "summary.json")
    assert summary["mean_queueing_s"] > 0
    done = replay(out)
    assert done.divergence is None and done.rows == len(recorded_rows(out))
    assert [done.summary[m] for m in METRICS] == pytest.approx([summary[m] for m in METRICS], rel=1e-9)


def _rewrite(run: Path, row: int, factor: float) -> None:
    """Scale one steps.csv row's duration by `factor`, as another GPU's step time would be."""
    path = run / "steps.csv"
    with path.open(newline="") as f:
        lines = list(csv.DictReader(f))
    lines[row]["duration_s"] = repr(float(lines[row]["duration_s"]) * factor)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)


def test_a_replay_whose_step_times_lead_elsewhere_names_the_row_it_left(tmp_path):
    out = tmp_path / "oracle"
    write_result(simulate(tiny("orca-oracle", cost_fixed_s=1e-3)), out)
    rows = recorded_rows(out)
    first_prefill = next(i for i, row in enumerate(rows) if row.kind == "prefill")
    _rewrite(out, first_prefill, 50.0)  # a stalled first step: everyone arrives meanwhile
    done = replay(out)
    assert done.divergence is not None
    assert done.divergence.row == first_prefill + 1  # the next row starts later than recorded
    assert done.divergence.recorded == rows[first_prefill + 1].describe()


# --- decode rows priced as the CUDA graph's bucket they run ------------------------------------

PADDED = {
    "model": "opt-13b",
    "fixed_s": 0.008,
    "per_token_s": 2e-5,
    "per_kv_token_s": 2e-7,
    "pads_decode": True,
}


def test_graph_rows_are_the_decode_loops_buckets():
    from kvbench.cost_model import graph_rows
    from kvbench.real.decode_loop import graph_buckets

    buckets = graph_buckets(512)  # the real runner's graphs at the default batch cap and above
    for batch in range(1, 700):
        assert graph_rows(batch) == next((b for b in buckets if b >= batch), batch), batch
    assert [graph_rows(n) for n in (3, 9, 57, 64, 65)] == [4, 16, 64, 64, 72]


def _opt13b(rate: float, cost: Path) -> RunConfig:
    """OPT-13B with 12 GiB, 300 ShareGPT requests: decode batches of 1 to a few dozen rows."""
    workload = WorkloadSpec("sharegpt-paper", num_requests=300, rate=rate, seed=5)
    return RunConfig(engine="orca-oracle", workload=workload, kv_cache_gib=12.0, cost_model=str(cost))


def test_a_padded_model_prices_every_decode_step_on_its_graphs_rows(tmp_path):
    from kvbench.cost_model import graph_rows
    from kvbench.results.load import read_csv

    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(PADDED))
    out = tmp_path / "run"
    write_result(simulate(_opt13b(6.0, cost)), out)
    steps = read_csv(out / "steps.csv", text=("kind",))
    decode = steps[steps["kind"] == "decode"]
    assert {9, 17}.issubset(set(decode["batch_size"]))  # batches the graphs pad by half or more
    for row in decode.itertuples():
        rows = graph_rows(row.batch_size)
        want = row.num_steps * (PADDED["fixed_s"] + PADDED["per_token_s"] * rows)
        want += PADDED["per_kv_token_s"] * row.context_tokens
        assert row.duration_s == pytest.approx(want, rel=1e-9)  # never the batch's own rows


def _graphed(run: Path) -> Path:
    """A run's summary marked as a GPU run's that replayed CUDA graphs (what `kvbench run` writes
    there): the simulation, priced with a padded model, stands in for one."""
    summary = read_json(run / "summary.json")
    (run / "summary.json").write_text(json.dumps(summary | {"cuda_graphs": True}))
    return run


def test_the_fit_counts_a_graphed_runs_decode_rows_as_its_graphs_ran_them(tmp_path):
    from kvbench.calibrate.fit import calibrate

    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(PADDED))
    runs = []
    for rate in (2.0, 8.0):
        out = tmp_path / f"rate-{rate:g}"
        write_result(simulate(_opt13b(rate, cost)), out)
        runs.append(out)
    as_batch = calibrate(runs, simulated_ok=True)  # the summaries say nothing of graphs: the batch
    assert not as_batch.cost.pads_decode and as_batch.p90_relative_error > 1e-3
    fitted = calibrate([_graphed(run) for run in runs], simulated_ok=True)
    assert fitted.cost.pads_decode and fitted.p90_relative_error < 1e-6
    assert fitted.cost.per_token_s == pytest.approx(PADDED["per_token_s"], rel=1e-6)
    assert fitted.cost.fixed_s == pytest.approx(PADDED["fixed_s"], rel=1e-6)
    assert as_batch.cost.per_token_s > 1.05 * PADDED["per_token_s"]  # padding spread over fewer rows


def test_graphed_and_eager_runs_are_not_fitted_together_and_old_files_price_the_batch(tmp_path):
    from kvbench.calibrate.fit import calibrate, cost_file_digest, load_cost_model
    from kvbench.errors import KvbenchError

    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(PADDED))
    graphed, eager = tmp_path / "graphed", tmp_path / "eager"
    write_result(simulate(_opt13b(2.0, cost)), graphed)
    write_result(simulate(_opt13b(2.0, cost)), eager)
    with pytest.raises(KvbenchError, match="replayed CUDA graphs and .* did not"):
        calibrate([_graphed(graphed), eager], simulated_ok=True)
    old = {key: value for key, value in PADDED.items() if key != "pads_decode"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "false.json").write_text(json.dumps(old | {"pads_decode": False}))
    assert not load_cost_model(str(tmp_path / "old.json"), "opt-13b").pads_decode
    assert cost_file_digest(str(tmp_path / "old.json")) == cost_file_digest(str(tmp_path / "false.json"))
    assert cost_file_digest(str(cost)) != cost_file_digest(str(tmp_path / "old.json"))
    (tmp_path / "bad.json").write_text(json.dumps(old | {"pads_decode": "yes"}))
    with pytest.raises(KvbenchError, match="'pads_decode' must be true or false"):
        load_cost_model(str(tmp_path / "bad.json"), "opt-13b")
