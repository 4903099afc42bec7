"""`kvbench reproduce`: the quick simulated run end to end, through the CLI as a user runs it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.reproduce.rows import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("fig2", "fig13", "fig12", "fig18b", "fig19")
SHARING = ("fig14", "fig15", "fig16", "fig17")
SHARING_REQUESTS = 30  # the sharing figures' module fixture: a resumed run must ask for the same
ENGINES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")


def kvbench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kvbench", *args], capture_output=True, text=True, env=env)


def quick_simulated(out: Path, figures: tuple[str, ...], requests: int) -> Path:
    """`kvbench reproduce FIGURES --quick --mode simulate` into `out`, as a user runs it."""
    args = ("--quick", "--mode", "simulate", "--num-requests", str(requests), "--out", str(out))
    proc = kvbench("reproduce", *figures, *args)
    assert proc.returncode == 0, proc.stderr
    assert "reproduce.md" in proc.stdout
    return out


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Path:
    return quick_simulated(tmp_path_factory.mktemp("reproduce") / "out", FIGURES, 200)


@pytest.fixture(scope="module")
def sharing(tmp_path_factory) -> Path:
    return quick_simulated(tmp_path_factory.mktemp("reproduce") / "sharing", SHARING, SHARING_REQUESTS)


def _rows(out: Path, figure: str) -> list[dict]:
    with open(out / figure / "figure.csv", newline="") as f:
        return list(csv.DictReader(f))


def _value(rows, engine, workload, metric) -> float:
    (row,) = [r for r in rows if (r["engine"], r["workload"], r["metric"]) == (engine, workload, metric)]
    return float(row["kvbench"])


def _check_written(out: Path, figures: tuple[str, ...]) -> None:
    for figure in figures:
        rows = _rows(out, figure)
        assert rows and tuple(rows[0]) == COLUMNS
        data = json.loads((out / figure / "figure.json").read_text())
        assert data["verdict"] and "\n" not in data["verdict"]
        assert data["plots"], data["notes"]
        for plot in data["plots"]:
            assert (out / figure / plot).is_file()
    report = (out / "reproduce.md").read_text()
    for figure in figures:
        assert f"**{figure}**" in report


def test_every_figure_writes_its_tables_and_plots(quick):
    _check_written(quick, FIGURES)
    assert (quick / "fig12" / "seed-0" / "sharegpt-paper" / "sweep.csv").is_file()
    assert (quick / "fig12" / "seed-0" / "alpaca-paper" / "sustained.csv").is_file()
    assert (quick / "fig19" / "seed-0" / "swap" / "sweep.csv").is_file()
    claims = (quick / "claims.md").read_text()
    assert "`kvbench kernels` measures it" in claims and "not measured in this folder" not in claims


def test_recompute_overhead_survives_a_pruned_requests_file(quick, tmp_path):
    """Committed results keep summaries and steps, not requests.csv: the prompts are then
    rebuilt from the run's config, to the token, so Figure 19 rebuilds from them alike."""
    import shutil

    from kvbench.reproduce.sweeps import preemption_overhead_ms, prompt_tokens

    cells = sorted((quick / "fig19" / "seed-0" / "recompute" / "cells").iterdir())
    measured = [(prompt_tokens(c), preemption_overhead_ms(c, "recompute")) for c in cells]
    assert any(overhead for _, overhead in measured)
    for cell, before in zip(cells, measured, strict=True):
        pruned = shutil.copytree(cell, tmp_path / cell.name, ignore=shutil.ignore_patterns("requests.csv"))
        assert (prompt_tokens(pruned), preemption_overhead_ms(pruned, "recompute")) == before
    # a cost the cell cannot resolve (constant 0) is no overhead measured, not a 0 ms one
    config = json.loads((pruned / "config.json").read_text())
    config["cost_model_constants"]["per_token_s"] = 0.0
    (pruned / "config.json").write_text(json.dumps(config))
    assert before[1] and preemption_overhead_ms(pruned, "recompute") is None


def test_a_simulated_reproduction_calibrates_nothing(quick):
    assert not (quick / "calibration").exists()
    assert "calibrated simulator" not in (quick / "reproduce.md").read_text()


def test_engines_relate_as_in_the_paper(quick):
    fig2 = _rows(quick, "fig2")
    assert _value(fig2, "paged", "sharegpt-paper", "token_states_%") > 90
    for engine in ("orca-max", "orca-pow2", "orca-oracle"):
        assert 15 < _value(fig2, engine, "sharegpt-paper", "token_states_%") < 45
    fig13 = _rows(quick, "fig13")
    for trace in ("sharegpt-paper", "alpaca-paper"):
        b = {
            e: _value(fig13, e, trace, "mean_batched_requests")
            for e in ("paged", "orca-oracle", "orca-pow2", "orca-max")
        }
        assert b["paged"] > b["orca-oracle"] > b["orca-pow2"] >= b["orca-max"], (trace, b)
    fig12 = _rows(quick, "fig12")
    assert _value(fig12, "paged/orca-max", "sharegpt-paper", "sustained_ratio") > 1


def test_unknown_figure_is_one_line_naming_the_figures(tmp_path):
    proc = kvbench("reproduce", "fig99", "--mode", "simulate", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "fig99" in lines[0]
        and "fig2, fig13, fig12, fig14, fig15, fig16, fig17, fig18b, fig19, claims" in lines[0]
    )
    assert not (tmp_path / "out").exists()


def test_cost_model_does_not_apply_to_real_runs(tmp_path):
    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps({"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-8})
    )
    proc = kvbench(
        "reproduce", "fig2", "--mode", "real", "--cost-model", str(cost), "--out", str(tmp_path / "o")
    )
    assert proc.returncode == 2 and "--cost-model" in proc.stderr


def test_a_cost_file_naming_no_model_is_refused_before_a_run(tmp_path):
    """Without its model, a fit's constants would price opt-13b's steps whatever they were fitted on."""
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"fixed_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-8}))
    out = tmp_path / "o"
    proc = kvbench("reproduce", "fig2", "--quick", "--mode", "simulate", "--num-requests", "5",
                   "--cost-model", str(cost), "--out", str(out))  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert (
        proc.stderr.startswith(f"error: --cost-model {cost}: names no model") and proc.stderr.count("\n") == 1
    )
    assert not out.exists()


def test_real_runs_pick_a_model_holding_the_papers_slots(tmp_path):
    """Quick real runs decode OPT-125M, full ones OPT-1.3B; either arena holds 16,384 slots (the
    paper's OPT-13B / 12 GB holds 15,728), so the engines batch as the paper's did."""
    from kvbench.budget import budget_from_gib
    from kvbench.config import resolve_model
    from kvbench.reproduce.run import setting_for

    quick, full = setting_for(True, None, quick=True), setting_for(True, None, quick=False)
    assert (quick.model, full.model) == ("opt-125m", "opt-1.3b") and quick.real and full.real
    assert quick.rate_scale > full.rate_scale  # the smaller model decodes faster: more load
    for s in (quick, full):
        assert budget_from_gib(s.kv_cache_gib, resolve_model(s.model)).num_slots == 16384, s
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"model": "opt-125m", "fixed_s": 0.001, "per_token_s": 1e-6}))
    calibrated = setting_for(False, str(cost), quick=True)
    assert (calibrated.model, calibrated.real, calibrated.rate_scale) == ("opt-125m", False, quick.rate_scale)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("--mode", "real", "--model", "opt-66b"), "opt-125m, opt-1.3b, opt-13b"),
        (("--mode", "simulate", "--model", "opt-125m"), "--cost-model"),
    ],
)
def test_a_model_the_run_cannot_take_is_one_line(tmp_path, args, names):
    proc = kvbench("reproduce", "fig2", *args, "--out", str(tmp_path / "o"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--model" in lines[0] and names in lines[0]
    assert not (tmp_path / "o").exists()


def test_sharing_figures_write_their_tables_and_plots(sharing):
    _check_written(sharing, SHARING)
    for sweep in ("fig14/seed-0/k6", "fig16/seed-0/fewshot-5", "fig17/seed-0/chat"):
        assert (sharing / sweep / "sweep.csv").is_file()
    assert (sharing / "fig15" / "seed-0" / "alpaca-paper" / "k6" / "summary.json").is_file()


def test_sharing_saves_memory_and_serves_more_as_in_the_paper(sharing):
    fig15 = _rows(sharing, "fig15")
    for trace in ("alpaca-paper", "sharegpt-paper"):
        for letter in "nk":
            saved = [_value(fig15, "paged", trace, f"saved_%@{letter}{w}") for w in (2, 4, 6)]
            assert 0 < saved[0] < saved[1] < saved[2] < 100, (trace, letter, saved)
        assert _value(fig15, "paged", trace, "saved_%@k2") > _value(fig15, "paged", trace, "saved_%@n6")
    fig14 = _rows(sharing, "fig14")
    beams = [_value(fig14, "paged/orca-oracle", f"alpaca-paper k={k}", "capacity_ratio") for k in (2, 6)]
    assert beams[1] > 1 and beams[0] < beams[1], beams
    fig16 = _rows(sharing, "fig16")
    one, five = (
        _value(fig16, "paged-prefix/orca-oracle", f"translation {p}", "capacity_ratio")
        for p in ("fewshot-1", "fewshot-5")
    )
    assert 1 < one < five
    # without the prefix cache paging alone gains far less on the 5-shot prompts
    paged = _value(fig16, "paged", "translation fewshot-5", "capacity_req_s")
    cached = _value(fig16, "paged-prefix", "translation fewshot-5", "capacity_req_s")
    assert cached > 1.5 * paged
    fig17 = _rows(sharing, "fig17")
    assert _value(fig17, "paged/orca-oracle", "sharegpt-paper chat", "capacity_ratio") > 1


def test_sharing_rates_are_brackets_at_most_10_percent_wide_as_figure_12s(sharing):
    """Figures 14, 16 and 17 bisect as Figure 12 does: every sustained rate with a failing rate
    above it is a bracket [last pass, first fail) at most 10 % wide, each sustained-rate ratio
    lies inside its interval, and the capacity ratio stands beside it."""
    from kvbench.reproduce.sweeps import FIG12_BRACKET, ratio_note

    bisected = 0
    for figure, numerator in (("fig14", "paged"), ("fig16", "paged-prefix"), ("fig17", "paged")):
        rows = _rows(sharing, figure)
        for row in rows:
            if row["metric"] == "sustained_rate_req_s" and row["kvbench"]:
                low, high = float(row["low"]), float(row["high"])
                assert low == float(row["kvbench"]) and low < high, row
                if high != float("inf"):
                    assert (high - low) / low <= FIG12_BRACKET, row
                    bisected += 1
            if row["metric"] == "sustained_ratio" and row["kvbench"]:
                assert float(row["low"]) <= float(row["kvbench"]) <= float(row["high"]), row
                capacity = [r for r in rows if (r["engine"], r["workload"], r["metric"]) == (
                    row["engine"], row["workload"], "capacity_ratio")]  # fmt: skip
                assert len(capacity) == 1, row
        notes = json.loads((sharing / figure / "figure.json").read_text())["notes"]
        assert ratio_note(numerator) in notes
    assert bisected  # a short simulated trace: Orca (Max) crosses the bound inside Figure 14's grid


def test_sharing_figures_decode_for_real(tmp_path, monkeypatch):
    """The real path of Figures 15 and 16 on a grid of one point each: a tiny random model
    decoding on the CPU (attention by the torch reference: the Triton kernels' own tests run
    them in the interpreter). Each figure value is checked against the run it came from and
    against what its definition allows."""
    from kvbench.reproduce import sharing as reproduce_sharing
    from kvbench.reproduce.rows import Options, Setting

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(reproduce_sharing, "PATTERNS", {"k": "beam"})
    monkeypatch.setattr(reproduce_sharing, "WIDTHS", (2,))
    monkeypatch.setattr(reproduce_sharing, "FIG16_RATIO", {"fewshot-1": 1.67})
    monkeypatch.setattr(reproduce_sharing, "FIG16_RATES", {"quick": (4.0,), "full": (4.0,), "real": (4.0,)})
    setting = Setting("tiny-opt", 0.01, 1.0, real=True, paper_threshold=False, device="cpu")
    options = Options(True, setting, num_requests=3)

    saved = reproduce_sharing.fig15(options, tmp_path / "fig15")
    for trace in ("alpaca-paper", "sharegpt-paper"):
        summary = json.loads((tmp_path / "fig15" / trace / "k2" / "summary.json").read_text())
        assert summary["mode"] == "real" and summary["engine"] == "paged" and summary["completed"] == 3
        rows = {r.metric: r for r in saved.rows if r.workload == trace}
        assert set(rows) == {"saved_%@k2", "preemptions@k2"}
        # two beams share the prompt, and their blocks until they diverge: between 0 and half saved
        assert rows["saved_%@k2"].kvbench == 100 * summary["sharing_saved_fraction"]
        assert 0 < rows["saved_%@k2"].kvbench < 50
        assert rows["saved_%@k2"].paper == reproduce_sharing.FIG15_SAVED_PCT[trace, "beam"].get(2)
        assert rows["preemptions@k2"].kvbench == summary["num_preemptions"]

    prefix = reproduce_sharing.fig16(options, tmp_path / "fig16")
    by_name = {
        f.parent.name: json.loads(f.read_text()) for f in (tmp_path / "fig16").rglob("cells/*/summary.json")
    }
    cells = list(by_name.values())
    # each engine unloaded (its baseline) and at 4 requests/s
    assert sorted(c["engine"] for c in cells) == ["orca-oracle"] * 2 + ["paged-prefix"] * 2
    for cell in cells:
        assert cell["mode"] == "real" and cell["completed"] == cell["num_requests"]
        hits = cell["prefix_hit_tokens"]
        if cell["engine"] == "orca-oracle":
            assert hits == 0  # no prefix cache
        else:  # whole 16-token blocks of the 80-token prefix, never the first request's
            assert 0 <= hits <= 80 * (cell["num_requests"] - 1) and hits % 16 == 0
    # capacity: the throughput each engine completed at the grid's one loaded rate
    capacity = {r.engine: r.kvbench for r in prefix.rows if r.metric == "capacity_req_s"}
    for engine in ("orca-oracle", "paged-prefix"):
        (loaded,) = [
            c for name, c in by_name.items() if name.startswith(f"{engine}__") and "__rate-4__" in name
        ]
        assert capacity[engine] == loaded["request_throughput"] > 0
    (ratio,) = [r.kvbench for r in prefix.rows if r.metric == "capacity_ratio"]
    assert ratio == capacity["paged-prefix"] / capacity["orca-oracle"]


def test_a_figure_run_again_resumes_its_finished_cells(sharing):
    cells = sorted((sharing / "fig17" / "seed-0" / "chat" / "cells").glob("*/summary.json"))
    assert cells
    stamps = [f.stat().st_mtime_ns for f in cells]
    before = _rows(sharing, "fig17")
    quick_simulated(sharing, ("fig17",), SHARING_REQUESTS)
    assert [f.stat().st_mtime_ns for f in cells] == stamps and _rows(sharing, "fig17") == before


def test_a_figure_of_other_settings_is_run_again_and_said_so(tmp_path):
    """A figure folder whose runs had another request count is replaced, not resumed, and the
    command names the folder and the setting rather than rerunning silently."""
    args = ("reproduce", "fig17", "--quick", "--mode", "simulate", "--out", str(tmp_path))

    def counts() -> set[int]:  # the loaded runs' request counts (baselines hold 5)
        summaries = [json.loads(p.read_text()) for p in tmp_path.glob("fig17/seed-0/*/cells/*/summary.json")]
        return {s["num_requests"] for s in summaries if s["num_requests"] > 5}

    first = kvbench(*args, "--num-requests", "20")
    assert first.returncode == 0 and "run again" not in first.stderr, first.stderr
    before = counts()
    again = kvbench(*args, "--num-requests", "28")
    assert again.returncode == 0, again.stderr
    assert "ran other settings (workload): its runs replaced, the figure's start again" in again.stderr
    assert len(before) == len(counts()) == 1 and counts() != before
    assert not list(tmp_path.rglob("earlier"))  # simulated runs are cheap: replaced, not kept


def test_rate_scale_multiplies_the_papers_rates_and_says_so(tmp_path):
    """`--rate-scale 2.5` runs Figure 13 at 2.5 x the paper's rates (its runs' config.json), and
    reproduce.md names the scale: a figure made at another load says which."""
    from kvbench.paper import FIG13_RATE

    proc = kvbench("reproduce", "fig13", "--quick", "--mode", "simulate", "--num-requests", "12",
                   "--rate-scale", "2.5", "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rates = {}
    for config in tmp_path.glob("fig13/seed-0/*/*/config.json"):
        workload = json.loads(config.read_text())["workload"]
        rates.setdefault(workload["source"], set()).add(workload["rate"])
    assert set(rates) == set(FIG13_RATE)
    assert all(rates[trace] == {2.5 * rate} for trace, rate in FIG13_RATE.items())
    assert "the paper's rates x 2.5" in (tmp_path / "reproduce.md").read_text()


def test_real_runs_of_other_settings_are_set_aside_not_deleted(tmp_path):
    """A real figure's sweep made with other settings moves to `<seed>/earlier/<sweep>` (then
    `<sweep>-2`, ...) whole, a user's file in it included: real runs cost GPU time."""
    from kvbench.reproduce.sweeps import set_aside

    seed = tmp_path / "fig12" / "seed-0"
    for n in (1, 2, 3):
        (seed / "alpaca-paper" / "cells").mkdir(parents=True)
        (seed / "alpaca-paper" / "notes.txt").write_text(f"{n}\n")
        kept = set_aside(seed / "alpaca-paper")
        assert kept == seed / "earlier" / ("alpaca-paper" if n == 1 else f"alpaca-paper-{n}")
        assert (kept / "notes.txt").read_text() == f"{n}\n" and (kept / "cells").is_dir()
    assert sorted(p.name for p in seed.iterdir()) == ["earlier"]


REAL_ENGINES = ("orca-oracle", "paged")  # the real reproduction's grid: two engines, three requests
# a trace draw of short answers (ShareGPT's longest 108 tokens, Alpaca's 25; seed 0's: 1140 and 150):
# every decode step of the tiny model is a real step on the CPU, and the steps are the test's time
REAL_SEED = 6


def test_a_real_reproduction_calibrates_the_simulator_on_its_own_runs(tmp_path, monkeypatch):
    """Real Figures 2 and 13 on two engines (a tiny model decoding on the CPU): each figure value
    is its run's own summary, the simulator is fitted to Figure 2's runs, Figure 13's Alpaca
    runs are replayed with it (its ShareGPT runs are Figure 2's, so fitted, never held out), and
    the report states the errors."""
    from kvbench.reproduce import calibration, engines
    from kvbench.reproduce.calibration import rewrite_held_out
    from kvbench.reproduce.rows import Options, Setting
    from kvbench.reproduce.run import run_reproduce

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for module in (engines, calibration):
        monkeypatch.setattr(module, "DEMO_ENGINES", REAL_ENGINES)
    setting = Setting("tiny-opt", 0.01, 1.0, real=True, paper_threshold=False, device="cpu")
    out = tmp_path / "rep"
    lines: list[str] = []
    options = Options(True, setting, num_requests=3, seed=REAL_SEED)
    run_reproduce(("fig2", "fig13"), options, out, echo=lines.append)
    seed = out / "fig2" / f"seed-{REAL_SEED}"
    fig2, fig13 = _rows(out, "fig2"), _rows(out, "fig13")
    for engine in REAL_ENGINES:
        summary = json.loads((seed / engine / "summary.json").read_text())
        assert summary["mode"] == "real" and summary["completed"] == 3
        occupancy = summary["occupancy_saturated"] or summary["occupancy"]
        # the saturated weighting is empty where no request waited for memory: so is the figure's cell
        written = next(r["kvbench"] for r in fig2 if (r["engine"], r["metric"]) == (engine, "token_states_%"))
        if written == "":
            assert summary["saturated_s"] == 0, summary["saturated_s"]
        else:
            assert float(written) == pytest.approx(100 * occupancy["token_states"], rel=1e-5)
        for trace, folder in (
            ("sharegpt-paper", seed),
            ("alpaca-paper", out / "fig13" / f"seed-{REAL_SEED}" / "alpaca-paper"),
        ):
            batched = json.loads((folder / engine / "summary.json").read_text())["mean_batched_requests"]
            assert _value(fig13, engine, trace, "mean_batched_requests") == pytest.approx(batched, rel=1e-5)
    cost = json.loads((out / "calibration" / "cost.json").read_text())
    fit = [f"fig2/seed-{REAL_SEED}/{e}" for e in REAL_ENGINES]
    assert cost["model"] == "tiny-opt" and cost["runs"] == fit
    held = sorted({c["run"] for c in cost["held_out"]})
    assert held == [f"fig13/seed-{REAL_SEED}/alpaca-paper/{e}" for e in sorted(REAL_ENGINES)]
    summary = cost["held_out_summary"]["output_token_throughput"]
    checks = [c for c in cost["held_out"] if c["metric"] == "output_token_throughput"]
    for c in checks:  # each error is the simulation's against the real run's own summary
        real = json.loads((out / c["run"] / "summary.json").read_text())
        assert c["real"] == real["output_token_throughput"] and c["error"] == c["simulated"] / c["real"] - 1
    errors = sorted(abs(c["error"]) for c in checks)
    assert summary["runs"] == len(errors) == len(REAL_ENGINES)
    assert summary["within_target"] == sum(e <= 0.10 for e in errors)
    assert summary["max_abs_error"] == errors[-1]
    page = (out / "calibration" / "held_out.md").read_text()
    assert f"fig13/seed-{REAL_SEED}/alpaca-paper/paged" in page
    split = {load: summary[load] for load in ("loaded", "unloaded")}
    assert split["loaded"]["runs"] + split["unloaded"]["runs"] == summary["runs"]
    opening = page[: page.index("## Every run")]  # the page opens with the split, never the pooled spread
    for load, spread in split.items():
        assert (
            f"| {load} | output_token_throughput | {spread['runs']} | {spread['within_target']} |" in opening
        )
    assert opening.index("| loaded |") < opening.index("| unloaded |")
    pages = {p.name: p.read_bytes() for p in (out / "calibration").iterdir()}
    (out / "calibration" / "held_out.md").unlink()
    rewrite_held_out(out)  # from cost.json's rows alone: what the calibration wrote
    assert {p.name: p.read_bytes() for p in (out / "calibration").iterdir()} == pages
    report = (out / "reproduce.md").read_text()
    assert "## The calibrated simulator against the real runs" in report
    assert any(line.startswith("calibration: fitted on fig2") for line in lines)


def test_place_only_computes_figure_12s_placements_and_runs_nothing_real(tmp_path, capsys):
    """`--place-only`: the calibrated placement simulations of Figure 12's real runs, for every
    seed, on this machine; no real cell, figure or report. A second call finds them finished
    (what a real invocation then does: the same `placed_rates`, resumed)."""
    from kvbench.errors import KvbenchError
    from kvbench.reproduce.rows import Options, Setting
    from kvbench.reproduce.run import run_reproduce
    from kvbench.sweep.grid import PAPER_ENGINES

    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps({"model": "tiny-opt", "fixed_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6})
    )
    setting = Setting("tiny-opt", 0.01, 1.0, real=True, paper_threshold=False, device="cpu",
                      placement=str(cost), place_only=True)  # fmt: skip
    out = tmp_path / "out"
    options = Options(True, setting, num_requests=3, seed=REAL_SEED, repeats=2)
    assert run_reproduce(["fig12"], options, out) == []
    placements = sorted(out.glob("fig12/seed-*/*.placement"))
    assert [p.relative_to(out).as_posix() for p in placements] == [
        f"fig12/seed-{s}/{trace}.placement" for s in (REAL_SEED, REAL_SEED + 1)
        for trace in ("alpaca-paper", "sharegpt-paper")
    ]  # fmt: skip
    stamps = {f: f.stat().st_mtime_ns for f in out.glob("fig12/seed-*/*.placement/cells/*/summary.json")}
    assert stamps and all(json.loads(f.read_text())["mode"] == "simulated" for f in stamps)
    assert not list(out.glob("fig12/seed-*/*-paper/cells"))  # no real cell
    assert not (out / "reproduce.md").exists() and not (out / "fig12" / "figure.csv").exists()
    said = [line for line in capsys.readouterr().out.splitlines() if ": placed " in line]
    assert len(said) == 4 and all(f"{engine} " in line for line in said for engine in PAPER_ENGINES)
    with pytest.raises(KvbenchError, match="--place-only places Figure 12's real runs: name fig12 alone"):
        run_reproduce(["fig12", "fig2"], options, out)
    run_reproduce(["fig12"], options, out)
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps


def test_real_rates_placed_by_the_calibrated_simulator(tmp_path, monkeypatch):
    """With a cost file of the real runs' model (`--place-with`), a rate figure's real runs go
    to two rates either side of each engine's sustained rate in the calibrated simulation of the
    same cells (bisected to 2 %, kept in `<sweep>.placement/`), then step past them or bisect
    until a pass and a fail at most 10 % apart bracket the real rate. What is asserted is where
    every run was placed and why.

    The bound is a fixed 10 s/token, not the shared multiple of the real baselines: tiny-opt's
    CPU steps take milliseconds (the cost file says 10 ms), so every run, simulated or real,
    passes on any machine under any load, and the path below is the same everywhere. Against
    the shared multiple of measured baselines, a 3-request cell passed or failed with the CPU's
    load at that moment: on a loaded 2-core box the same cells passed in one run and failed in
    the next, bisecting one engine 5x, and an engine failing every rate down to its step below
    the pair would have left no pass to bracket with."""
    from kvbench.reproduce import sweeps
    from kvbench.reproduce.rows import Options, Setting
    from kvbench.reproduce.sweeps import PLACED_SPREAD, sweep
    from tests.test_sweep import rows_of

    PLACED_STEPS = 1  # the module's 4, lowered: each step is a real run on the CPU
    monkeypatch.setattr(sweeps, "PLACED_STEPS", PLACED_STEPS)

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps({"model": "tiny-opt", "fixed_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6})
    )
    setting = Setting(
        "tiny-opt", 0.01, 1.0, real=True, paper_threshold=False, device="cpu", placement=str(cost)
    )
    options = Options(True, setting, num_requests=3, seed=REAL_SEED)
    folder = tmp_path / "fig" / "sharegpt-paper"
    bound = 10.0  # s/token: far above any step here, simulated or measured (see the docstring)

    def run():
        return sweep(options, folder, engines=REAL_ENGINES, trace="sharegpt-paper", rates=(1.0, 8.0, 64.0),
                     block_sizes=(16,), kv=0.01, threshold=bound, bracket=0.1)  # fmt: skip

    first = run()
    simulated = json.loads((folder.with_name("sharegpt-paper.placement") / "sweep.json").read_text())
    assert simulated["mode"] == "simulated" and simulated["base_config"]["cost_model"] == str(cost)
    assert simulated["sustained"]["bracket"] == 0.02 and simulated["cell_run"]["tables"] is False
    placement = folder.with_name("sharegpt-paper.placement") / "cells"
    assert list(placement.glob("*/summary.json")) and not list(placement.glob("*/steps.csv"))  # summaries
    assert list(folder.glob("cells/*/steps.csv"))  # the real cells keep their rows
    real = json.loads((folder / "sweep.json").read_text())
    assert real["mode"] == "real" and real["sustained"]["extend"] == PLACED_STEPS
    assert simulated["sustained"]["baseline"] == real["sustained"]["baseline"]  # the same cells
    placed = {engine: tuple(pair) for engine, pair in real["axes"]["engine_rates"]}
    rows = rows_of(folder / "sweep.csv")
    for row in rows_of(folder.with_name("sharegpt-paper.placement") / "sustained.csv"):
        # the simulation passed every rate: each engine placed around the highest rate passed
        assert not row["first_fail_rate"] and "every swept rate" in row["how"]
        assert float(row["last_pass_rate"]) == 64.0
        assert placed[row["engine"]] == pytest.approx((64.0 / PLACED_SPREAD, 64.0 * PLACED_SPREAD), rel=1e-3)
    assert {row["role"] for row in rows} == {"grid", "bisect"}  # a fixed bound: no baselines run
    for row in rows_of(folder / "sustained.csv"):
        engine = row["engine"]
        cells = [r for r in rows if r["engine"] == engine]
        assert [float(r["rate"]) for r in cells if r["role"] == "grid"] == list(placed[engine])
        tried = [float(r["rate"]) for r in cells]
        assert int(row["bisect_cells"]) == len(tried) - 2 and all(float(r["completed"]) == 3 for r in cells)
        # passed both placed rates, so stepped up past them, each step just under the 10 % bracket,
        # and passed there too: a lower bound, said so
        assert not row["first_fail_rate"] and float(row["last_pass_rate"]) == tried[-1]
        assert f"stepped outside the grid {PLACED_STEPS}x" in row["how"] and len(tried) == 2 + PLACED_STEPS
        assert tried[-1] == pytest.approx(placed[engine][1] * 1.095, rel=1e-3)
    # the cost file refitted (as a real reproduction does after each invocation): a resumed
    # figure keeps the rates its real runs were placed at and reruns none of them
    refit = {"model": "tiny-opt", "fixed_s": 0.5, "per_token_s": 1e-3, "per_kv_token_s": 1e-5}
    cost.write_text(json.dumps(refit))
    again = run()
    kept = json.loads((folder / "sweep.json").read_text())["axes"]["engine_rates"]
    assert kept == real["axes"]["engine_rates"]
    assert again.ran == 0 and again.resumed == first.ran == len(rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mode", "simulate"), "--mode real"),
        (("--mode", "real", "--model", "opt-125m"), "no such file"),
        (("--mode", "real", "--model", "opt-125m", "COST13"), "fitted on opt-13b"),
    ],
)
def test_place_with_takes_a_cost_file_of_the_real_runs_model(tmp_path, args, message):
    cost = tmp_path / "cost13.json"
    cost.write_text(json.dumps({"model": "opt-13b", "fixed_s": 0.01}))
    place = str(cost) if "COST13" in args else str(tmp_path / "missing.json")
    proc = kvbench("reproduce", "fig12", *[a for a in args if a != "COST13"], "--place-with", place,
                   "--out", str(tmp_path / "o"))  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--place-with" in lines[0] and message in lines[0]
    assert not (tmp_path / "o").exists()
