"""Held-out means held out, and loaded runs apart: real runs of a tiny model on the CPU.

A held-out run of a fitted run's trace and seed replays the fitted requests, so it is dropped
and named; the errors of runs that queued are counted apart from those of runs that did not
(whose throughput is their arrival rate whatever the step times)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.calibrate.check import Check, format_summary, headline, read_config, summarize, trace_draw
from kvbench.config import RunConfig
from kvbench.reproduce.calibration import HeldOutSet, held_out_markdown, rewrite_held_out, write_sets
from kvbench.simulate import write_result
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
TRACE = "uniform:prompt=8..24,output=4..12"


def real(out: Path, seed: int, num_requests: int, rate: float, **extra) -> Path:
    """A real run of tiny-llama on the CPU. Whether it queues does not depend on the machine's
    speed: at 1e4 req/s every request has arrived before the first step ends and at most two
    run at once; at 0.01 req/s requests arrive minutes apart, and the engine jumps its clock
    over the idle time (tiny-llama's steps take milliseconds)."""
    from kvbench.real.run import run_real

    workload = WorkloadSpec(TRACE, num_requests=num_requests, rate=rate, seed=seed)
    # the PyTorch attention: what is checked here is the calibration's bookkeeping, not the kernels
    config = RunConfig(engine="paged", model="tiny-llama", workload=workload, kv_cache_gib=0.01, block_size=4,
                       attention="torch", **extra)  # fmt: skip
    write_result(run_real(config), out)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("held")
    real(root / "fit" / "a", 2, 6, 1e4, max_num_seqs=2)
    real(root / "held" / "same-draw", 2, 4, 0.01)  # the fitted trace and seed at another rate and count
    real(root / "held" / "idle", 3, 3, 0.01)
    real(root / "held" / "queued", 4, 6, 1e4, max_num_seqs=2)
    return root


def test_a_held_out_run_of_a_fitted_trace_draw_is_dropped_and_the_rest_split_by_load(runs, tmp_path):
    cost = tmp_path / "cost.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "calibrate", str(runs / "fit"), "--held-out", str(runs / "held"),
         "--out", str(cost)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads(cost.read_text())
    same = runs / "held" / "same-draw"
    assert written["held_out_dropped"] == [{
        "run": str(same), "shares_draw_with": str(runs / "fit" / "a"),
        "trace": TRACE, "seed": 2, "num_requests": 4, "rate": 0.01,
    }]  # fmt: skip
    note = f"dropped 1 held-out runs with a fitted run's trace and seed, so its requests: {same}"
    assert note in done.stdout
    checked = {c["run"] for c in written["held_out"]}
    assert checked == {str(runs / "held" / "idle"), str(runs / "held" / "queued")}
    fitted_draws = {trace_draw(read_config(Path(run))) for run in written["runs"]}
    held_draws = {trace_draw(read_config(Path(run))) for run in checked}
    assert fitted_draws == {(TRACE, 2)} and held_draws == {(TRACE, 3), (TRACE, 4)}
    assert not fitted_draws & held_draws  # the held-out requests were never fitted
    loads = {c["run"]: c["loaded"] for c in written["held_out"]}
    assert loads == {str(runs / "held" / "idle"): False, str(runs / "held" / "queued"): True}
    queued = json.loads((runs / "held" / "queued" / "summary.json").read_text())
    assert queued["saturated_s"] > 0  # the loaded one waited for admission: the batch cap held it back
    for metric in ("output_token_throughput", "normalized_latency_s", "mean_ttft_s"):
        summary = written["held_out_summary"][metric]
        assert summary["runs"] == 2 and summary["loaded"]["runs"] == 1 and summary["unloaded"]["runs"] == 1
    assert "| held/queued | paged | loaded | output_token_throughput |" in done.stdout
    assert "held out: output_token_throughput " in done.stdout
    assert "  assumed, no run measured it: per_swap_block_s = " in done.stdout  # no run swapped
    assert "per_swap_block_s" in written["assumed"] and "per_swap_block_s" in written["assumed_from"]
    assert "of 1 loaded runs within 10 % (" in done.stdout


def test_a_held_out_run_sharing_the_draw_is_never_fitted_nor_checked(runs, tmp_path):
    """`fit_and_check` directly: the dropped run is in neither set, whatever its rate."""
    from kvbench.calibrate.check import fit_and_check

    fit, same = runs / "fit" / "a", runs / "held" / "same-draw"
    done = fit_and_check([fit], [same, runs / "held" / "idle"], tmp_path / "cost.json")
    assert done.dropped == [(same, fit)]
    assert {c.run for c in done.checks} == {str(runs / "held" / "idle")}
    assert read_config(same).workload.rate != read_config(fit).workload.rate  # not a copy: another rate


def _check(run: str, metric: str, error: float, loaded: bool | None) -> Check:
    return Check(run, "paged", metric, 100.0, 100.0 * (1 + error), loaded)


def test_summaries_count_loaded_and_unloaded_runs_apart():
    """An unloaded run's throughput error is ~0 by construction: it must not lift the loaded count."""
    checks = [
        _check("a", "output_token_throughput", 0.001, False),
        _check("b", "output_token_throughput", 0.002, False),
        _check("c", "output_token_throughput", 0.30, True),
        _check("d", "output_token_throughput", -0.05, True),
        _check("e", "output_token_throughput", 0.5, None),
    ]
    summary = summarize(checks)["output_token_throughput"]
    assert summary["runs"] == 5 and summary["within_target"] == 3
    assert summary["loaded"] == {"runs": 2, "median_abs_error": pytest.approx(0.30),
                                 "max_abs_error": pytest.approx(0.30), "within_target": 1}  # fmt: skip
    assert summary["unloaded"]["runs"] == 2 and summary["unloaded"]["within_target"] == 2
    assert headline(checks) == "output_token_throughput 1 of 2 loaded runs within 10 % (2 of 2 unloaded)"
    table = held_out_markdown([HeldOutSet("Figures 12-13", summarize(checks), ["fig12/paged-2"])])
    lines = table.splitlines()
    assert lines[0].startswith("| held-out runs | metric | loaded: within 10 % |")
    row = "| Figures 12-13 | output_token_throughput | 1 of 2 | 30.0 % | 30.0 % | 2 of 2 | 0.2 % |"
    assert lines[2] == row
    assert lines[-1] == "- Figures 12-13: 1 runs (fig12/paged-2)"
    opening = format_summary(checks).splitlines()
    assert opening[0] == "Headline: output_token_throughput 1 of 2 loaded runs within 10 % (2 of 2 unloaded)."
    rows = [line for line in opening if line.startswith("| ") and not line.startswith("| load |")]
    assert rows == [  # loaded first; the run of unknown load in neither, and no pooled row
        "| loaded | output_token_throughput | 2 | 1 | 30.0 % | 30.0 % |",
        "| unloaded | output_token_throughput | 2 | 2 | 0.2 % | 0.2 % |",
    ]
    assert opening[-1] == "1 runs of unknown load are counted in neither row."


def test_an_older_sets_file_without_the_split_still_reads():
    """`held_out_sets.json` written before the split: its rows say no loaded run, never a guess."""
    old = {"output_token_throughput": {"runs": 3, "median_abs_error": 0.01, "max_abs_error": 0.02,
                                       "within_target": 3}}  # fmt: skip
    table = held_out_markdown([HeldOutSet(**{"label": "Figures 14-17", "summary": old})])
    assert table.splitlines()[2] == "| Figures 14-17 | output_token_throughput | none | - | - | none | - |"


def test_runs_set_aside_in_a_seed_folder_are_not_held_out(runs, tmp_path):
    """A seed's panel run again at one commit's run code leaves the earlier panel beside it
    (`<seed>/earlier/`): the reproduction's held-out sets take the panel that replaced it only,
    not the same draw twice."""
    from kvbench.reproduce.calibration import _real_runs

    out = tmp_path / "out"
    kept = out / "fig12" / "seed-0" / "alpaca-paper" / "cells" / "paged-1"
    aside = out / "fig12" / "seed-0" / "earlier" / "alpaca-paper" / "cells" / "paged-1"
    for folder in (kept, aside):
        shutil.copytree(runs / "held" / "queued", folder)
    assert _real_runs(out, ("fig12",)) == [kept]
    shutil.rmtree(kept)
    assert _real_runs(out, ("fig12",)) == []


def _pages(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "cost.json"}


def test_held_out_pages_open_with_the_split_and_rewrite_from_cost_json_alone(runs, tmp_path):
    """Each held-out page begins with its errors for loaded and unloaded runs apart, loaded
    first, never pooled; and a committed calibration's pages are rewritten from its cost.json
    rows alone, byte for byte what the calibration wrote, a row without `loaded` taking it
    from its run's own files."""
    from kvbench.calibrate.check import fit_and_check

    out = tmp_path / "out"
    shutil.copytree(runs / "fit" / "a", out / "fig2" / "a")
    for name, run in (("fig12/queued", "queued"), ("fig13/idle", "idle"), ("fig15/idle", "idle")):
        shutil.copytree(runs / "held" / run, out / name)
    folder = out / "calibration"
    done = fit_and_check([out / "fig2/a"], [out / "fig12/queued", out / "fig13/idle", out / "fig15/idle"],
                         folder / "cost.json", out)  # fmt: skip
    write_sets(folder, done.checks, [])
    written = _pages(folder)
    assert sorted(written) == ["held_out.md", "held_out_sets.json", "held_out_sharing.md"]
    page = written["held_out.md"].decode().splitlines()
    assert page[0] == "# Figures 12-13: real runs beside the calibrated simulation"
    assert (
        page[2].startswith("Headline: output_token_throughput ") and "of 1 loaded runs within 10 %" in page[2]
    )
    summary = page[
        page.index("| load | metric | runs | within 10 % | median abs. error | largest abs. error |") :
    ]
    summary = summary[2 : summary.index("")]
    assert [row.split(" | ")[:3] for row in summary] == [
        [f"| {load}", metric, "1"] for load in ("loaded", "unloaded")
        for metric in ("output_token_throughput", "normalized_latency_s", "mean_ttft_s")
    ]  # fmt: skip
    assert page.index("## Every run") > page.index(summary[-1])
    sharing = written["held_out_sharing.md"].decode().splitlines()
    assert sharing[2].startswith("Headline: output_token_throughput 0 of 0 loaded runs within 10 % (")
    assert "| loaded | output_token_throughput | 0 | 0 | - | - |" in sharing

    for name in written:
        (folder / name).unlink()
    assert [s.label for s in rewrite_held_out(out)] == ["Figures 12-13", "Figures 14-17"]
    assert _pages(folder) == written
    cost = json.loads((folder / "cost.json").read_text())
    for row in cost["held_out"]:
        del row["loaded"]  # a calibration written before the split
    (folder / "cost.json").write_text(json.dumps(cost))
    rewrite_held_out(out)
    assert _pages(folder) == written


def test_the_rewrite_tool_refuses_a_folder_without_a_calibration_in_one_line(tmp_path, capsys):
    from tests.support import load_script

    tool = load_script("tools/rewrite_held_out.py")
    assert tool.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path}: no calibration/cost.json to rewrite the held-out pages from\n"
    assert not any(tmp_path.iterdir())  # nothing written into a folder kvbench did not make
