"""`calibrate` over several run folders: what it refuses, and what it fills in where no step row
measured a term (`kvbench/calibrate/fit.py`: `calibrate`, `_assume`).

Runs of two models, or of graph-replayed and eager decode steps, price their steps differently:
one fit over both would be a constant of neither, so each is refused naming the runs. A term no
row measures is set from the roofline of the runs' own GPU and block size and named as assumed
with its source, which is what turns a verdict resting on it into "not measured". Step tables
are written by hand (distinct values a row), so each rule holds for the rows given. Decode rows
whose cost per row steepens past a batch size fit that knee: its batch, its cost per row, error
figures priced with it, and the command's line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvbench.budget import get_gpu
from kvbench.calibrate.fit import calibrate, load_cost_model, shape_lines
from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from kvbench.models import get_model
from tests.support import run_with_steps

COLUMNS = ("kind", "num_steps", "batch_size", "num_tokens", "context_tokens", "kv_tokens_read",
           "swapped_blocks", "mapped_pages", "unmapped_pages", "attention_pairs", "duration_s")  # fmt: skip


def _rows(
    n: int, *, prefill: bool, seed: int = 0, prompt_token_s: float = 2e-5, maps: bool = True
) -> list[tuple]:
    """`n` step rows of a made-up linear cost, decode only or with every third row a prefill
    (whose tokens cost `prompt_token_s` each); `maps`: rows map and unmap pages."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        is_prefill = prefill and i % 3 == 0
        batch = int(rng.integers(1, 40))
        tokens = int(rng.integers(100, 900)) if is_prefill else batch
        context = tokens if is_prefill else int(rng.integers(batch * 50, batch * 900))
        mapped = int(rng.integers(0, 9)) if maps else 0
        token_s = prompt_token_s if is_prefill else 2e-5
        duration = 0.008 + token_s * tokens + 3e-7 * context + 1e-5 * mapped + (0.004 if is_prefill else 0.0)
        kind, pairs = ("prefill", tokens * tokens / 2) if is_prefill else ("decode", 0)
        unmapped = int(rng.integers(0, 5)) if maps else 0
        rows.append((kind, 1, batch, tokens, context, context, 0, mapped, unmapped, pairs, duration))
    return rows


def _run(folder: Path, rows: list[tuple], *, summary: dict | None = None, config: dict | None = None) -> Path:
    return run_with_steps(folder, COLUMNS, rows, summary=summary, config=config)


def _refused(runs: list[Path]) -> str:
    with pytest.raises(KvbenchError) as error:
        calibrate(runs, simulated_ok=True)
    return str(error.value)


def test_no_run_is_refused():
    assert _refused([]) == "kvbench calibrate: give at least one run folder"


def test_runs_of_two_models_are_refused_naming_both(tmp_path):
    a = _run(tmp_path / "a", _rows(30, prefill=True))
    b = _run(tmp_path / "b", _rows(30, prefill=True, seed=1), summary={"model": "gemma-3-12b"})
    assert _refused([a, b]) == "kvbench calibrate: the runs are of different models (gemma-3-12b, opt-13b)"


def test_graph_replayed_and_eager_runs_are_refused_naming_one_of_each(tmp_path):
    eager = _run(tmp_path / "eager", _rows(30, prefill=True))
    graphed = _run(tmp_path / "graphed", _rows(30, prefill=True, seed=1), summary={"cuda_graphs": True})
    other = _run(tmp_path / "other", _rows(30, prefill=True, seed=2))
    message = _refused([eager, other, graphed])
    assert message == (
        f"kvbench calibrate: {graphed} replayed CUDA graphs and {eager} did not; their decode steps cost "
        "differently, fit them apart"
    )


def test_runs_with_replayed_and_eager_prefills_are_refused_naming_one_of_each(tmp_path):
    eager = _run(tmp_path / "eager", _rows(30, prefill=True), config={"prefill_graphs": False})
    graphed = _run(tmp_path / "graphed", _rows(30, prefill=True, seed=1), config={"prefill_graphs": True})
    other = _run(tmp_path / "other", _rows(30, prefill=True, seed=2))  # a config.json without the key
    assert _refused([other, graphed, eager]) == (
        f"kvbench calibrate: {graphed} replayed its short prefills as CUDA graphs (--prefill-graphs) and "
        f"{other} ran them eagerly; their prefill steps cost differently, fit them apart"
    )
    both = calibrate([_run(tmp_path / "g2", _rows(30, prefill=True, seed=3), config={"prefill_graphs": True}),
                      graphed], simulated_ok=True)  # fmt: skip
    assert both.rows == 60  # runs of one kind fit together


@pytest.mark.parametrize("fitted_graphs", [True, False])
def test_a_held_out_run_of_the_other_prefill_kind_is_refused_before_fitting(tmp_path, fitted_graphs):
    """A fit prices one kind of prefill step; a held-out run of the other kind is refused by name
    before anything is written (its error would be the prefill mode's)."""
    from kvbench.calibrate.check import fit_and_check

    fit = _run(tmp_path / "fit", _rows(30, prefill=True), summary={"mode": "real"},
               config={"prefill_graphs": fitted_graphs})  # fmt: skip
    other = _run(tmp_path / "other", _rows(30, prefill=True, seed=1), summary={"mode": "real"},
                 config={"prefill_graphs": not fitted_graphs})  # fmt: skip
    out = tmp_path / "cost.json"
    with pytest.raises(KvbenchError) as error:
        fit_and_check([fit], [other], out)
    ran, fit_ran = ("as CUDA graphs", "eagerly") if not fitted_graphs else ("eagerly", "as CUDA graphs")
    assert str(error.value) == (
        f"--held-out {other}: its short prefills ran {ran} and the fitted runs' {fit_ran} "
        "(--prefill-graphs); hold out runs of the fit's kind"
    )
    assert not out.exists()


def test_graph_replayed_runs_fit_a_model_that_pads_and_eager_ones_one_that_does_not(tmp_path):
    graphed = calibrate([_run(tmp_path / "g", _rows(40, prefill=True), summary={"cuda_graphs": True})],
                        simulated_ok=True)  # fmt: skip
    assert graphed.cost.pads_decode is True
    assert (
        calibrate([_run(tmp_path / "e", _rows(40, prefill=True))], simulated_ok=True).cost.pads_decode
        is False
    )


def test_without_a_prefill_row_prompt_tokens_cost_a_decode_rows_and_the_prefill_terms_are_assumed(tmp_path):
    """Decode rows that map pages: the prefill-token term is unmeasured (None, a decode row's
    cost), not 0, whatever other columns hold."""
    fit = calibrate([_run(tmp_path / "d", _rows(40, prefill=False))], simulated_ok=True)
    assert fit.cost.per_prefill_token_s is None and fit.cost.per_prefill_s == 0.0
    assert {"per_prefill_s", "per_prefill_token_s"} <= set(fit.cost.assumed)
    assert (
        fit.assumed_from["per_prefill_token_s"] == "none: decode rows' per-token cost (no prefill row to fit)"
    )
    with_prefill = calibrate([_run(tmp_path / "p", _rows(40, prefill=True))], simulated_ok=True)
    assert with_prefill.cost.per_prefill_token_s == pytest.approx(2e-5, rel=1e-3)
    assert "per_prefill_token_s" not in with_prefill.cost.assumed


def test_unmeasured_swap_and_copy_costs_come_from_the_runs_gpu_and_block_size(tmp_path):
    run = _run(
        tmp_path / "h200", _rows(40, prefill=True), config={"emulate_gpu": "h200-141gb", "block_size": 32}
    )
    fit = calibrate([run], simulated_ok=True)
    roofline = CostModel.roofline(get_model("opt-13b"), get_gpu("h200-141gb"), 32)
    assert fit.cost.per_swap_block_s == roofline.per_swap_block_s
    assert fit.cost.per_copy_slot_s == roofline.per_copy_slot_s
    assert {"per_swap_block_s", "per_copy_slot_s"} <= set(fit.cost.assumed)
    assert fit.assumed_from["per_swap_block_s"].endswith(" (32-slot blocks of opt-13b)")
    assert fit.assumed_from["per_copy_slot_s"].endswith(" (opt-13b on the h200-141gb)")
    assert "per_map_page_s" not in fit.cost.assumed  # the rows map pages: measured


def test_a_run_that_names_no_gpu_or_block_size_is_priced_on_the_a100_at_16(tmp_path):
    run = _run(tmp_path / "bare", _rows(40, prefill=True))
    config = json.loads((run / "config.json").read_text())
    for key in ("emulate_gpu", "block_size"):
        config.pop(key, None)
    (run / "config.json").write_text(json.dumps(config))
    fit = calibrate([run], simulated_ok=True)
    roofline = CostModel.roofline(get_model("opt-13b"), get_gpu("a100-40gb"), 16)
    assert fit.cost.per_swap_block_s == roofline.per_swap_block_s != 0
    assert fit.assumed_from["per_swap_block_s"].endswith(" (16-slot blocks of opt-13b)")
    assert fit.assumed_from["per_copy_slot_s"].endswith(" (opt-13b on the a100-40gb)")


def test_prefill_rows_whose_tokens_cost_nothing_fit_a_measured_zero_not_an_assumed_default(tmp_path):
    fit = calibrate(
        [_run(tmp_path / "z", _rows(45, prefill=True, prompt_token_s=0.0, maps=False))], simulated_ok=True
    )
    assert fit.cost.per_prefill_token_s == 0.0 and "per_prefill_token_s" not in fit.cost.assumed
    assert "per_map_page_s" in fit.cost.assumed  # no row mapped a page: the driver's measured cost


def test_each_assumed_terms_source_says_where_its_value_comes_from(tmp_path):
    fit = calibrate([_run(tmp_path / "s", _rows(40, prefill=True, maps=False))], simulated_ok=True)
    assert fit.assumed_from["per_swap_block_s"].startswith("roofline: ")
    assert fit.assumed_from["per_copy_slot_s"].startswith("roofline: a slot's K/V read and written")
    assert fit.assumed_from["per_map_page_s"].startswith("H200 driver, results/reference/vmm-probe")


def test_a_model_without_a_preset_roofline_assumes_free_copies_and_says_so(tmp_path):
    run = _run(
        tmp_path / "folder-model", _rows(40, prefill=True, maps=False), summary={"model": "my-checkpoint"}
    )
    fit = calibrate([run], simulated_ok=True)
    assert fit.model == "my-checkpoint"
    assert fit.cost.per_swap_block_s == 0.0 and fit.cost.per_copy_slot_s == 0.0
    none = "none: 0 (no preset roofline of the model)"
    assert fit.assumed_from["per_swap_block_s"] == fit.assumed_from["per_copy_slot_s"] == none
    assert fit.cost.per_map_page_s > 0 and "per_map_page_s" in fit.cost.assumed  # the driver's cost kept


# a decode row's made-up cost: per step, per row, per K/V slot read, per runner call, and per
# row past `KNEE` rows (a step's rows past the knee, times its steps)
KNEE, FIXED, ROW, KV, SEGMENT, ABOVE = 64, 0.010, 1e-5, 2e-7, 5e-4, 4e-5


def _knee_rows(above: float = ABOVE) -> list[tuple]:
    """Decode rows of 1, 2 and 4 steps at 12 batch sizes (half of them past `KNEE`, which the
    search tries: two sizes or more on each side), each costing exactly the model above with
    `above` per row past the knee: rows the non-negative fit describes exactly."""
    rows = []
    for i, batch in enumerate((8, 16, 32, 48, 56, 64, 72, 80, 96, 128, 160, 192)):
        for j, steps in enumerate((1, 2, 4)):
            context = steps * batch * (100 + 37 * ((i + j) % 5)) + 11 * i  # not a multiple of the rows
            duration = (FIXED * steps + ROW * batch * steps + KV * context + SEGMENT
                        + above * steps * max(batch - KNEE, 0))  # fmt: skip
            rows.append(("decode", steps, batch, batch * steps, context, context, 0, 0, 0, 0, duration))
    return rows


def test_decode_rows_steeper_past_a_batch_size_fit_that_knee_and_its_cost_per_row(tmp_path):
    """The fit finds the knee at 64 rows and 40 us a row past it, every other constant as made,
    and its error figures price the knee: 0 on every row (priced without it, the 18 rows past it,
    half of them, would err by 2.2-22.4 %: median 1.1 %, p90 19.6 %)."""
    fit = calibrate([_run(tmp_path / "knee", _knee_rows())], simulated_ok=True)
    c = fit.cost
    assert c.knee_batch == KNEE and isinstance(c.knee_batch, int)
    assert c.per_row_above_knee_s == pytest.approx(ABOVE, rel=1e-9)
    assert (c.fixed_s, c.per_token_s, c.per_kv_token_s, c.per_segment_s) == pytest.approx(
        (FIXED, ROW, KV, SEGMENT), rel=1e-9
    )
    assert fit.rows == 36 and fit.median_relative_error < 1e-9 and fit.p90_relative_error < 1e-9
    assert c.above_knee(KNEE) == 0.0 and c.above_knee(192) == pytest.approx(128 * ABOVE, rel=1e-9)
    assert "decode knee: 40.000 us more per row past 64 rows" in shape_lines(fit)
    # the same rows at one cost per row: no knee, and its term 0
    linear = calibrate([_run(tmp_path / "linear", _knee_rows(above=0.0))], simulated_ok=True)
    assert linear.cost.knee_batch is None and linear.cost.per_row_above_knee_s == 0.0
    assert linear.cost.per_token_s == pytest.approx(ROW, rel=1e-9)
    assert not any(line.startswith("decode knee") for line in shape_lines(linear))


def test_the_command_prints_the_knee_and_writes_it_to_the_cost_file(tmp_path):
    """`kvbench calibrate` on a real run of those rows: the error figures it prints are the
    knee's (0.0 %), it names the knee, and the file it writes loads back with it."""
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    run = _run(tmp_path / "knee", _knee_rows(), summary={"mode": "real"})
    out = tmp_path / "cost.json"
    done = CliRunner().invoke(app, ["calibrate", str(run), "--out", str(out)])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0].startswith("opt-13b: fixed 10.000 ms/step, 10.000 us/decode row, ")
    assert lines[0].endswith(" (36 rows; relative error median 0.0 %, p90 0.0 %)")
    assert "  decode knee: 40.000 us more per row past 64 rows" in lines
    loaded = load_cost_model(str(out), "opt-13b")
    assert loaded.knee_batch == KNEE and loaded.per_row_above_knee_s == pytest.approx(ABOVE, rel=1e-9)


def test_the_default_knee_gain_keeps_the_knee_noisy_rows_hide_and_every_file_records_its_rule(tmp_path):
    """The knee's rows with 5 us a row past 64 and 1 % of wobble on every row: the default rule
    (a knee must cut the line's error by a tenth) keeps the knee at 64, the earlier rule
    (`--knee-gain 0.5`: halve it) drops it, and each file says the rule it was fitted under."""
    from typer.testing import CliRunner

    from kvbench.calibrate.fit import EARLIER_KNEE_GAIN, KNEE_GAIN
    from kvbench.cli.app import app

    assert (KNEE_GAIN, EARLIER_KNEE_GAIN) == (0.9, 0.5)
    rows = [(*row[:-1], row[-1] * (1 + 0.01 * np.sin(k))) for k, row in enumerate(_knee_rows(above=5e-6))]
    run = _run(tmp_path / "knee", rows, summary={"mode": "real"})
    files = {}
    for name, flags in (("default", []), ("halve", ["--knee-gain", "0.5"])):
        files[name] = tmp_path / f"{name}.json"
        done = CliRunner().invoke(app, ["calibrate", str(run), *flags, "--out", str(files[name])])
        assert done.exit_code == 0, done.output
    default, halve = (json.loads(path.read_text()) for path in files.values())
    assert default["knee_batch"] == KNEE and default["knee_gain"] == 0.9
    assert halve["knee_batch"] is None and halve["knee_gain"] == 0.5
