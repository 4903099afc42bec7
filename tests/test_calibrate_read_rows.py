"""What the calibration fit reads from a run's steps.csv, column by column (`read_rows`).

The fit prices a step from counts it takes out of steps.csv: a column read into the wrong term,
a mixed chunked step not priced as a prefill, the CUDA graphs' padded rows not counted, or a bad
value let through would bias every constant it fits, with nothing to say so. Each test writes a
hand-made steps.csv of distinct values into a run folder and checks the fit's matrix exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvbench.calibrate.fit import read_rows
from kvbench.cost_model import graph_rows
from kvbench.errors import KvbenchError
from tests.support import run_with_steps

# kind, num_steps, batch_size, num_tokens, context_tokens, kv_tokens_read, swapped_blocks,
# mapped_pages, unmapped_pages, attention_pairs, duration_s: every value distinct
ROWS = (
    ("decode", 3, 5, 15, 700, 650, 2, 7, 11, 0, 0.031),
    ("prefill", 1, 2, 400, 400, 390, 0, 13, 17, 81000, 0.052),
    ("mixed", 1, 9, 260, 900, 880, 3, 19, 23, 33000, 0.047),
    ("decode", 2, 37, 74, 5000, 4800, 0, 29, 31, 0, 0.044),
)
COLUMNS = ("kind", "num_steps", "batch_size", "num_tokens", "context_tokens", "kv_tokens_read",
           "swapped_blocks", "mapped_pages", "unmapped_pages", "attention_pairs", "duration_s")  # fmt: skip
OPTIONAL = ("kv_tokens_read", "mapped_pages", "unmapped_pages", "attention_pairs", "batch_size")


def _run(tmp_path: Path, rows=ROWS, columns=COLUMNS, **summary) -> Path:
    return run_with_steps(tmp_path / "run", columns, rows, summary=summary)


def _column(index: int) -> np.ndarray:
    return np.array([row[index] for row in ROWS], dtype=np.float64)


PREFILL = np.array([0, 1, 1, 0], dtype=np.float64)  # the mixed step is priced as a prefill


def test_every_fitted_term_comes_from_its_own_column(tmp_path):
    rows = read_rows(_run(tmp_path), simulated_ok=True)
    steps, batch, tokens, _, reads, swapped, mapped, unmapped, pairs, duration = (
        _column(i) for i in range(1, 11)
    )
    expected = np.column_stack([
        steps, tokens * (1 - PREFILL), reads, swapped, PREFILL, tokens * PREFILL, mapped, unmapped,
        1 - PREFILL, pairs * PREFILL,
    ])  # fmt: skip
    np.testing.assert_array_equal(rows.counts, expected)
    np.testing.assert_array_equal(rows.durations, duration)
    np.testing.assert_array_equal(rows.batch, batch * (1 - PREFILL))  # prefill rows: no knee
    assert not rows.padded and rows.model == "opt-13b" and rows.config["engine"] == "paged"


def test_without_the_optional_columns_the_context_stands_for_the_reads_and_the_rest_is_zero(tmp_path):
    keep = [i for i, name in enumerate(COLUMNS) if name not in OPTIONAL]
    run = _run(tmp_path, [tuple(row[i] for i in keep) for row in ROWS], [COLUMNS[i] for i in keep])
    rows = read_rows(run, simulated_ok=True)
    np.testing.assert_array_equal(rows.counts[:, 2], _column(4))  # context_tokens
    assert not rows.counts[:, 6:8].any() and not rows.counts[:, 9].any() and not rows.batch.any()


def test_graph_replayed_decode_rows_count_the_rows_their_graph_ran(tmp_path):
    """Under CUDA graphs a decode row of batch b runs its bucket's rows: its tokens are those
    rows x its steps, and so is its batch; prefill rows keep their own tokens."""
    rows = read_rows(_run(tmp_path, cuda_graphs=True), simulated_ok=True)
    buckets = np.array([graph_rows(int(b)) for b in _column(2)], dtype=np.float64)
    assert list(buckets) == [8, 2, 16, 40]
    np.testing.assert_array_equal(rows.counts[:, 1], (buckets * _column(1)) * (1 - PREFILL))
    np.testing.assert_array_equal(rows.counts[:, 5], _column(3) * PREFILL)
    np.testing.assert_array_equal(rows.batch, buckets * (1 - PREFILL))
    assert rows.padded


@pytest.mark.parametrize(("row", "column", "bad"), [(0, "num_tokens", -1), (2, "duration_s", "nan"),
                                                     (3, "mapped_pages", "inf")])  # fmt: skip
def test_a_count_or_duration_that_is_not_a_finite_number_at_least_zero_names_its_line_and_column(
    tmp_path, row, column, bad
):
    rows = [list(r) for r in ROWS]
    rows[row][COLUMNS.index(column)] = bad
    run = _run(tmp_path, rows)
    with pytest.raises(KvbenchError) as error:
        read_rows(run, simulated_ok=True)
    assert str(error.value).startswith(f"{run / 'steps.csv'}: line {row + 2}, column {column!r}: ")
    assert str(error.value).endswith("is not a finite number >= 0")


def test_a_missing_column_a_simulated_run_or_no_run_is_refused(tmp_path):
    keep = [i for i, name in enumerate(COLUMNS) if name != "swapped_blocks"]
    run = _run(tmp_path, [tuple(row[i] for i in keep) for row in ROWS], [COLUMNS[i] for i in keep])
    with pytest.raises(
        KvbenchError, match=r"steps.csv: no column 'swapped_blocks' \(written by an older kvbench\?\)"
    ):
        read_rows(run, simulated_ok=True)
    with pytest.raises(KvbenchError, match=r": a simulated run: its step times are a cost model's"):
        read_rows(_run(tmp_path / "sim"))
    with pytest.raises(KvbenchError, match=r"not a kvbench run folder \(no steps.csv and summary.json\)"):
        read_rows(tmp_path / "nothing", simulated_ok=True)


def test_a_run_without_its_summary_or_config_is_read_as_far_as_it_can_be(tmp_path):
    run = _run(tmp_path)
    (run / "config.json").unlink()
    assert read_rows(run, simulated_ok=True).config == {}  # the assumed terms then use their defaults
    (run / "summary.json").unlink()
    with pytest.raises(KvbenchError, match=r"not a kvbench run folder \(no steps.csv and summary.json\)"):
        read_rows(run, simulated_ok=True)


def test_an_external_engines_run_is_refused_naming_the_engine(tmp_path):
    run = _run(tmp_path, external=True, engine="hf-generate")
    with pytest.raises(KvbenchError) as error:
        read_rows(run, simulated_ok=True)
    assert str(error.value) == f"{run}: a run of the external engine hf-generate: its steps are not kvbench's"


def test_a_simulated_run_is_refused_saying_why(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(KvbenchError) as error:
        read_rows(run)
    assert str(error.value) == (
        f"{run}: a simulated run: its step times are a cost model's, and a fit to them would return that "
        "model; fit real runs (kvbench run)"
    )


def test_a_sliding_window_model_needs_the_kv_reads_column(tmp_path):
    """Its window layers read less K/V than the context counts: without the reads the fit would
    price K/V that was never read."""
    keep = [i for i, name in enumerate(COLUMNS) if name != "kv_tokens_read"]
    without = [tuple(row[i] for i in keep) for row in ROWS]
    run = _run(tmp_path, without, [COLUMNS[i] for i in keep], model="gemma-3-12b")
    with pytest.raises(KvbenchError) as error:
        read_rows(run, simulated_ok=True)
    assert str(error.value) == (
        f"{run / 'steps.csv'}: no column 'kv_tokens_read' (written by an older kvbench?), and gemma-3-12b's "
        "sliding-window layers read less K/V than its context_tokens counts; rerun it with this kvbench"
    )
    assert read_rows(_run(tmp_path / "with", model="gemma-3-12b"), simulated_ok=True).model == "gemma-3-12b"
    dense = _run(tmp_path / "dense", without, [COLUMNS[i] for i in keep])
    np.testing.assert_array_equal(read_rows(dense, simulated_ok=True).counts[:, 2], _column(4))
