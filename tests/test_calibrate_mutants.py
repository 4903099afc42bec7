"""The calibration fit's arithmetic pinned exactly: the non-negative least squares, each
objective's weights and rounds, the knee search (candidates, sides, subsampling, gain), the
rows a fit drops, and a calibration's error figures and assumed terms
(`kvbench/calibrate/fit.py`, scope `calibrate` of docs/MUTATION.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from kvbench.calibrate.fit import (
    EARLIER_KNEE_GAIN,
    KNEE_CANDIDATES,
    MEAN_FLOOR,
    MEAN_ROUNDS,
    Calibration,
    _fit_scaled,
    _nnls,
    calibrate,
    fit,
    fit_shape,
    knee_column,
    predict,
    read_rows,
    shape_lines,
)
from kvbench.config import RunConfig
from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from kvbench.simulate import simulate, write_result
from workloads.spec import WorkloadSpec

TRUE = dict(cost_fixed_s=0.012, cost_per_token_s=4e-5, cost_per_kv_token_s=3e-7)


def simulated(out: Path, seed: int = 0, num_requests: int = 40) -> Path:
    workload = WorkloadSpec("sharegpt-paper", num_requests=num_requests, rate=4.0, seed=seed)
    write_result(simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0, **TRUE)), out)
    return out


def scale_durations(run: Path, factors: dict[int, float]) -> None:
    """Multiply the duration of the step rows `factors` names (0-based) in the run's steps.csv."""
    path = run / "steps.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for index, factor in factors.items():
        rows[index]["duration_s"] = repr(float(rows[index]["duration_s"]) * factor)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def weighted(counts: np.ndarray, durations: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Plain least squares of every row divided by `scale` (the reference of a fit whose
    constants all come out positive)."""
    solution, *_ = np.linalg.lstsq(counts / scale[:, None], durations / scale, rcond=None)
    return solution


def noisy_rows() -> tuple[np.ndarray, np.ndarray]:
    """Decode-like rows (steps, tokens, K/V tokens) with noise and one row far slower than
    any fit prices (so the mean objective's floor holds it)."""
    rng = np.random.default_rng(5)
    steps = rng.integers(1, 30, 60).astype(np.float64)
    rows = rng.integers(1, 20, 60).astype(np.float64)
    counts = np.column_stack([steps, steps * rows, steps * rows * rng.integers(50, 500, 60)])
    durations = counts @ np.array([0.01, 3e-4, 3e-7]) * rng.uniform(0.9, 1.1, 60)
    durations[7] *= 40.0
    return counts, durations


def test_nnls_keeps_the_best_feasible_subset_and_its_exact_loss():
    a = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 2.0, 0.0]])
    x, loss = _nnls(a, np.array([2.0, 1.5, 1.0]))  # unconstrained: slope -0.5
    assert x.tolist() == pytest.approx([1.5, 0.0, 0.0], abs=1e-12)
    assert loss == pytest.approx(0.5, abs=1e-12)
    x, loss = _nnls(a, np.array([1.0, 1.5, 2.0]))  # both columns, exactly
    assert x.tolist() == pytest.approx([1.0, 0.5, 0.0], abs=1e-12) and loss == pytest.approx(0.0, abs=1e-20)
    x, loss = _nnls(a, np.array([-1.0, -2.0, -3.0]))  # nothing feasible beats all zero
    assert x.tolist() == [0.0, 0.0, 0.0] and loss == 14.0
    x, loss = _nnls(a[:, 1:2], np.array([0.0, 1.0, 2.0]))  # the first column alone that is not zero
    assert x.tolist() == pytest.approx([1.0]) and loss == pytest.approx(0.0, abs=1e-20)


@pytest.mark.parametrize("objective", ["mean", "relative", "absolute"])
def test_every_objective_recovers_exact_constants_and_drops_rows_of_zero_duration(objective):
    counts, _ = noisy_rows()
    truth = np.array([0.01, 2e-5, 3e-7])
    durations = counts @ truth
    counts = np.vstack([counts, [[3.0, 40.0, 9000.0]]])  # a row measured as 0 s: not fitted
    durations = np.append(durations, 0.0)
    assert fit(counts, durations, objective) == pytest.approx(truth, rel=1e-9)
    with pytest.raises(
        KvbenchError, match=r"^calibration objective 'median': not one of mean, relative, absolute$"
    ):
        fit(counts, durations, "median")


def test_each_objective_weighs_the_rows_as_its_definition_says():
    counts, durations = noisy_rows()
    steps = counts[:, 0]
    assert fit(counts, durations, "relative") == pytest.approx(
        weighted(counts, durations, durations), rel=1e-9
    )
    even = np.delete(counts, 7, axis=0), np.delete(durations, 7)  # absolute: the slow row would price < 0
    absolute = weighted(*even, np.sqrt(even[0][:, 0]))
    assert fit(*even, "absolute") == pytest.approx(absolute, rel=1e-9)
    c = weighted(counts, durations, durations)  # the mean objective: a relative start, then its rounds
    floored = 0
    for _ in range(MEAN_ROUNDS):
        scale = np.maximum(counts @ c, MEAN_FLOOR * durations)
        floored += int((counts @ c < MEAN_FLOOR * durations).sum())
        c = weighted(counts, durations, scale / np.sqrt(steps))
    assert (MEAN_ROUNDS, MEAN_FLOOR) == (3, 0.1) and floored > 0  # the slow row is held by the floor
    assert fit(counts, durations, "mean") == pytest.approx(c, rel=1e-9)
    assert fit(counts, durations) == pytest.approx(c, rel=1e-9)  # the default


def test_knee_column_predict_and_a_linear_fit_without_a_knee():
    steps, batch = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.0, 3.0, 5.0, 9.0])
    assert knee_column(steps, batch, 5).tolist() == [0.0, 0.0, 0.0, 16.0]
    counts = np.column_stack([steps, steps * batch])
    constants = np.array([1.0, 0.5, 0.25])
    assert predict(counts, batch, constants, 5).tolist() == [1.0, 5.0, 10.5, 26.0]
    assert predict(counts, batch, constants, None).tolist() == [1.0, 5.0, 10.5, 22.0]
    batch = np.arange(1.0, 41.0)  # exactly linear rows: no knee, and its term 0
    counts = np.column_stack([np.ones(40), batch])
    constants, knee = fit_shape(counts, counts @ np.array([9e-3, 2e-5]), batch)
    assert knee is None and constants == pytest.approx([9e-3, 2e-5, 0.0], rel=1e-9, abs=1e-18)


def hinged(sizes: np.ndarray, knee: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.column_stack([np.ones(len(sizes)), sizes])
    return counts, counts @ np.array([9e-3, 2e-5]) + 6e-5 * np.maximum(sizes - knee, 0)


@pytest.mark.parametrize("knee", [2, 4, 16])
def test_a_knee_is_found_two_sizes_in_from_either_end(knee):
    sizes = np.arange(1.0, 7.0) if knee < 16 else np.arange(1.0, 41.0)
    counts, durations = hinged(sizes, knee)
    constants, found = fit_shape(counts, durations, sizes)
    assert found == knee and constants == pytest.approx([9e-3, 2e-5, 6e-5], rel=1e-9)


def test_a_knee_one_size_from_the_end_is_not_tried():
    sizes = np.arange(1.0, 7.0)
    _, durations = hinged(sizes, 5)  # candidates are sizes 2-4
    counts = np.column_stack([np.ones(6), sizes])
    scale = durations
    tried = {k: _nnls(np.column_stack([counts / scale[:, None], knee_column(np.ones(6), sizes, k) / scale]),
                      durations / scale)[1] for k in (2, 3, 4)}  # fmt: skip
    found = _fit_scaled(counts, durations, sizes, scale)[1]
    assert found == min(tried, key=tried.get) == 4


def test_many_sizes_try_evenly_spaced_knees():
    sizes = np.arange(1.0, 101.0)  # 97 candidates (2-98), 32 of them tried
    tried = 2 + np.linspace(0, 96, KNEE_CANDIDATES).round().astype(int)
    assert KNEE_CANDIDATES == 32 and 33 in tried and 32 not in tried and 34 not in tried
    counts, durations = hinged(sizes, 33)
    assert fit_shape(counts, durations, sizes)[1] == 33
    counts, durations = hinged(sizes, 98)  # the last candidate is tried
    assert 98 in tried and fit_shape(counts, durations, sizes)[1] == 98
    counts, durations = hinged(sizes, 31)  # not tried (50 evenly spaced would try it): a neighbour instead
    assert 31 not in tried and fit_shape(counts, durations, sizes)[1] in (30, 33)


def test_a_knee_is_kept_only_when_it_at_least_halves_the_linear_error():
    sizes = np.arange(1.0, 41.0)
    counts = np.column_stack([np.ones(40), sizes])
    wobble = 1 + 0.01 * np.sin(np.arange(40.0))
    for bend, kept in ((1e-7, False), (6e-5, True)):
        durations = (counts @ np.array([9e-3, 2e-5]) + bend * np.maximum(sizes - 16, 0)) * wobble
        linear = _nnls(counts / durations[:, None], np.ones(40))[1]
        best = min(_nnls(np.column_stack([counts / durations[:, None],
                                          knee_column(np.ones(40), sizes, k) / durations]), np.ones(40))[1]
                   for k in range(2, 39))  # fmt: skip
        assert (best <= 0.5 * linear) is kept and (best < linear)
        knee = _fit_scaled(counts, durations, sizes, durations)[1]
        assert (knee is not None) is kept


def test_a_calibration_reports_its_rows_errors_and_assumed_terms(tmp_path):
    run = simulated(tmp_path / "a")
    scale_durations(run, {3: 1.5, 10: 0.7, 20: 2.0, 40: 1.1})
    fitted = calibrate([run], simulated_ok=True)
    rows = read_rows(run, simulated_ok=True)
    c = fitted.cost
    constants = np.array([c.fixed_s, c.per_token_s, c.per_kv_token_s, c.per_swap_block_s, c.per_prefill_s,
                          c.per_prefill_token_s, c.per_map_page_s, c.per_unmap_page_s, c.per_segment_s,
                          c.per_attention_pair_s])  # fmt: skip
    measured = rows.counts.any(axis=0)
    error = np.abs(rows.counts[:, measured] @ constants[measured] - rows.durations) / rows.durations
    assert fitted.rows == len(rows.durations) == 114 and c.knee_batch is None
    assert fitted.median_relative_error == pytest.approx(float(np.median(error)), rel=1e-9)
    assert fitted.p90_relative_error == pytest.approx(float(np.quantile(error, 0.9)), rel=1e-9)
    assert fitted.median_relative_error > 1e-4  # the scaled rows are off the fit
    assert c.assumed == ("per_swap_block_s", "per_map_page_s", "per_unmap_page_s", "per_copy_slot_s")
    assert list(fitted.assumed_from) == list(c.assumed)
    assert c.per_map_page_s == 3.55e-05 and c.per_unmap_page_s == 2.23e-05
    assert fitted.assumed_from["per_copy_slot_s"].endswith("(opt-13b on the a100-40gb)")
    assert fitted.assumed_from["per_swap_block_s"].endswith("(16-slot blocks of opt-13b)")
    assert c.per_swap_block_s == pytest.approx(0.000534288, rel=1e-9)
    data = fitted.to_dict()
    assert data["assumed"] == list(c.assumed) and data["rows"] == 114 and data["runs"] == [str(run)]
    assert data["median_relative_error"] == fitted.median_relative_error
    assert data["p90_relative_error"] == fitted.p90_relative_error
    assert data["model"] == "opt-13b" and data["assumed_from"] == fitted.assumed_from
    assert data["fixed_s"] == c.fixed_s and data["knee_batch"] is None


def test_too_few_rows_for_the_measured_constants_are_refused(tmp_path):
    """The first 7 rows of a run (prefill and decode alternate) measure 7 constants: 6 rows are
    refused, 7 fitted."""
    run = simulated(tmp_path / "a")
    lines = (run / "steps.csv").read_text().splitlines()
    (run / "steps.csv").write_text("\n".join(lines[:7]) + "\n")
    assert int(read_rows(run, simulated_ok=True).counts.any(axis=0).sum()) == 7
    with pytest.raises(KvbenchError, match=r"^kvbench calibrate: 6 step rows are too few to fit 7 constants"):
        calibrate([run], simulated_ok=True)
    (run / "steps.csv").write_text("\n".join(lines[:8]) + "\n")
    assert calibrate([run], simulated_ok=True).rows == 7


def test_shape_lines_say_the_padding_segment_attention_knee_and_each_assumed_term():
    cost = CostModel(0.01, 2e-5, 3e-7, per_swap_block_s=5.25e-4, per_row_above_knee_s=6e-5, knee_batch=16,
                     per_segment_s=6e-4, pads_decode=True, per_attention_pair_s=2.5e-12,
                     per_prefill_token_s=None,
                     assumed=("per_swap_block_s", "per_prefill_token_s"))  # fmt: skip
    calibration = Calibration(cost, "opt-13b", ("a",), 10, 0.0, 0.0, {"per_swap_block_s": "roofline"})
    assert shape_lines(calibration) == [
        "decode rows: as the CUDA graph's bucket a batch pads to (1, 2, 4, then multiples of 8)",
        "decode segment: 0.600 ms more per runner call (a decode row)",
        "prefill attention: 0.003 ns a query-key pair",
        "decode knee: 60.000 us more per row past 16 rows",
        "assumed, no run measured it: per_swap_block_s = 0.000525 s (roofline)",
        "assumed, no run measured it: per_prefill_token_s = a decode row's (?)",
    ]
    plain = Calibration(CostModel(0.01, 2e-5, 3e-7), "opt-13b", ("a",), 10, 0.0, 0.0)
    linear = "decode: linear in its rows (no knee cut the line's error by {}: --knee-gain {})"
    assert shape_lines(plain) == [linear.format("10 %", "0.9")]
    halve = Calibration(CostModel(0.01, 2e-5, 3e-7), "opt-13b", ("a",), 10, 0.0, 0.0, knee_gain=0.5)
    assert shape_lines(halve) == [linear.format("50 %", "0.5")]


def test_a_fit_without_prefill_rows_or_a_preset_model_assumes_and_says_so(tmp_path):
    """Decode rows alone leave both prefill terms to assume (the token cost a decode row's, None);
    a model kvbench has no preset of has no roofline: its swap and copy costs are assumed 0."""
    run = simulated(tmp_path / "a")
    lines = (run / "steps.csv").read_text().splitlines()
    kind = lines[0].split(",").index("kind")
    (run / "steps.csv").write_text(
        "\n".join([lines[0], *(x for x in lines[1:] if x.split(",")[kind] == "decode")])
    )
    fitted = calibrate([run], simulated_ok=True)
    assert fitted.cost.per_prefill_token_s is None and fitted.cost.per_prefill_s == 0.0
    assert fitted.cost.assumed == ("per_swap_block_s", "per_prefill_s", "per_prefill_token_s",
                                   "per_map_page_s", "per_unmap_page_s", "per_copy_slot_s")  # fmt: skip
    assert (
        fitted.assumed_from["per_prefill_token_s"]
        == "none: decode rows' per-token cost (no prefill row to fit)"
    )
    assert fitted.cost.fixed_s == pytest.approx(0.012, rel=1e-6)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"model": "/models/private-13b"}))
    fitted = calibrate([run], simulated_ok=True)
    assert (fitted.cost.per_swap_block_s, fitted.cost.per_copy_slot_s) == (0.0, 0.0)
    none = "none: 0 (no preset roofline of the model)"
    assert fitted.assumed_from["per_swap_block_s"] == fitted.assumed_from["per_copy_slot_s"] == none


def test_nnls_tries_every_subset_of_a_size_past_an_infeasible_one():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    x, loss = _nnls(a, np.array([-1.0, 1.0, 1.0]))  # the first column alone prices < 0, the second not
    assert x.tolist() == pytest.approx([0.0, 1.0]) and loss == pytest.approx(1.0)


def test_nnls_keeps_the_first_of_equally_good_fits():
    """Two equal columns (decode rows of one step each: `num_steps` and the segment count): the
    first column alone fits exactly, and neither the second alone nor both share it."""
    a = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    x, loss = _nnls(a, np.array([1.0, 2.0, 3.0]))
    assert x.tolist() == pytest.approx([1.0, 0.0], abs=1e-12) and loss == pytest.approx(0.0, abs=1e-20)


def test_the_mean_rounds_scale_each_row_by_its_prediction_knee_included():
    sizes = np.arange(1.0, 41.0)
    counts, durations = hinged(sizes, 16)
    durations = durations * (1 + 0.01 * np.sin(np.arange(40.0)))
    steps = counts[:, 0]
    constants, knee = _fit_scaled(counts, durations, sizes, durations)
    without = constants, knee
    for _ in range(MEAN_ROUNDS):
        scale = np.maximum(predict(counts, sizes, constants, knee), MEAN_FLOOR * durations) / np.sqrt(steps)
        constants, knee = _fit_scaled(counts, durations, sizes, scale)
        scale = np.maximum(predict(counts, sizes, without[0], None), MEAN_FLOOR * durations) / np.sqrt(steps)
        without = _fit_scaled(counts, durations, sizes, scale)
    fitted, found = fit_shape(counts, durations, sizes)
    assert found == knee is not None and fitted == pytest.approx(constants, rel=1e-9)
    assert not np.allclose(without[0], constants, rtol=1e-6)  # the rows priced without the knee fit otherwise


def test_a_knee_on_a_flat_decode_cost_is_found_with_no_per_row_cost():
    """Rows that cost the same up to 16 and more past it: the knee's fit prices no row below it."""
    sizes = np.arange(1.0, 41.0)
    counts = np.column_stack([np.ones(40), sizes])
    durations = 9e-3 + 6e-5 * np.maximum(sizes - 16, 0)
    constants, knee = fit_shape(counts, durations, sizes)
    assert knee == 16 and constants == pytest.approx([9e-3, 0.0, 6e-5], rel=1e-9, abs=1e-15)


def test_the_default_keeps_a_knee_the_earlier_rule_drops_and_every_file_says_its_rule(tmp_path):
    """A bend past 16 rows that cuts the linear fit's error by a fifth (0.80 of it): the default
    (`KNEE_GAIN`, a tenth) keeps it, the earlier rule (`EARLIER_KNEE_GAIN`, half) drops it; a
    bend that cuts it by 7 % is dropped by both. Every fit writes its rule (`knee_gain`)."""
    sizes = np.arange(1.0, 41.0)
    counts = np.column_stack([np.ones(40), sizes])
    wobble = 1 + 0.01 * np.sin(np.arange(40.0))
    for bend, kept in ((1e-5, True), (1e-6, False)):
        durations = (counts @ np.array([9e-3, 2e-5]) + bend * np.maximum(sizes - 16, 0)) * wobble
        assert _fit_scaled(counts, durations, sizes, durations, EARLIER_KNEE_GAIN)[1] is None
        assert (_fit_scaled(counts, durations, sizes, durations)[1] is not None) is kept
    run = simulated(tmp_path / "a")
    assert calibrate([run], simulated_ok=True).to_dict()["knee_gain"] == 0.9
    assert calibrate([run], simulated_ok=True, knee_gain=0.5).to_dict()["knee_gain"] == 0.5
