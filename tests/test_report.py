"""Plots, `kvbench report` and `kvbench compare`: real simulated runs, saved, then read back.

Every figure is made from files on disk only (the runs are simulated and written first);
the CLI runs as a subprocess; the HTML page is opened in headless Chromium where one is
installed, to check that every image decodes and the page logs no error.
"""

from __future__ import annotations

import csv
import html
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines import ENGINES
from kvbench.config import RunConfig
from kvbench.report.figures import (
    PlotSkipped,
    plot_batched_bars,
    plot_batched_vs_rate,
    plot_block_size,
    plot_latency_cdfs,
    plot_latency_vs_rate,
    plot_memory_timeline,
    plot_occupancy_bars,
    plot_occupancy_timeline,
    plot_roofline,
)
from kvbench.report.format import significant
from kvbench.report.plot_time import roofline_efficiency
from kvbench.report.style import ENGINE_COLORS, step_series
from kvbench.results.load import as_runs, load_sweep
from kvbench.simulate import simulate, write_result
from workloads.spec import WorkloadSpec

pytest.importorskip("matplotlib")
ROOT = Path(__file__).resolve().parent.parent
ERROR = "not a kvbench results folder (no summary.json or sweep.csv)"


def kvbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def _simulate(engine: str, out: Path, rate: float = 4.0, block_size: int = 16, n: int = 24) -> Path:
    workload = WorkloadSpec("sharegpt-paper", num_requests=n, seed=1, rate=rate)
    config = RunConfig(engine=engine, workload=workload, kv_cache_gib=2.0, block_size=block_size)
    write_result(simulate(config), out)
    return out


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """A folder of run folders, one per engine of ENGINES (like `kvbench demo` writes)."""
    root = tmp_path_factory.mktemp("runs")
    for engine in ENGINES:
        _simulate(engine, root / engine)
    return root


def _add_collector_columns(run: Path) -> None:
    """Turn a simulated run into what a real run with collectors writes: memory and roofline columns."""
    with open(run / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    summary = json.loads((run / "summary.json").read_text())
    arena = summary["num_slots"] * summary["kv_bytes_per_token"]
    for i, row in enumerate(rows):
        row["torch_allocated_bytes"] = arena + 2**30 + 1000 * i
        row["torch_reserved_bytes"] = arena + 2**31
        row["nvml_used_bytes"] = arena + 3 * 2**30
        decode = row["kind"] == "decode"
        row["roofline_s"] = 0.5 * float(row["duration_s"]) if decode else ""
    with open(run / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary["arena_bytes"] = arena
    summary["mode"] = "real"
    summary["roofline_efficiency"] = 0.5
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def real_like(tmp_path_factory) -> Path:
    run = _simulate("paged", tmp_path_factory.mktemp("real") / "paged")
    _add_collector_columns(run)
    return run


SWEEP_COLUMNS = ("engine", "rate", "block_size", "kv_cache_gib", "seed", "trace", "status",
                 "request_throughput", "normalized_latency_s", "mean_batched_requests")  # fmt: skip


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """A sweep folder in the documented layout (sweep.csv, cells/, sustained.csv), its cells simulated."""
    root = tmp_path_factory.mktemp("sweep")
    rows = []
    cells = [(e, r, 16) for e in ("orca-max", "orca-oracle", "paged") for r in (1.0, 4.0, 16.0)]
    cells += [("paged", r, 32) for r in (1.0, 4.0, 16.0)]
    for engine, rate, block in cells:
        cell = f"{engine}-r{rate:g}-b{block}"
        _simulate(engine, root / "cells" / cell, rate=rate, block_size=block, n=16)
        s = json.loads((root / "cells" / cell / "summary.json").read_text())
        rows.append([engine, rate, block, 2.0, 1, "sharegpt-paper", "ok", s["request_throughput"],
                     s["normalized_latency_s"], s["mean_batched_requests"]])  # fmt: skip
    rows.append(["orca-pow2", 4.0, 16, 2.0, 1, "sharegpt-paper", "failed", "", "", ""])
    with open(root / "sweep.csv", "w", newline="") as f:
        csv.writer(f).writerows([SWEEP_COLUMNS, *rows])
    with open(root / "sustained.csv", "w", newline="") as f:
        csv.writer(f).writerows([
            ["engine", "trace", "sustained_rate", "threshold_s"],
            ["paged", "sharegpt-paper", 4.0, 0.5],
            ["orca-max", "sharegpt-paper", 1.0, 0.5],
        ])  # fmt: skip
    return root


def _check_written(paths: list[Path]) -> str:
    """Both files exist and are what they claim; returns the SVG's text."""
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths[1].read_text()
    assert "<svg" in svg
    return svg


def test_every_engine_has_its_own_color():
    assert set(ENGINES) <= set(ENGINE_COLORS)
    assert len(set(ENGINE_COLORS.values())) == len(ENGINE_COLORS)


def test_run_figures_render_from_saved_files(runs_dir, tmp_path):
    folders = sorted(runs_dir.iterdir())
    svg = _check_written(plot_occupancy_bars(folders, tmp_path / "occupancy"))
    for engine in ENGINES:
        color = ENGINE_COLORS[engine].lower()  # every tick label spelled as in ENGINES, in the engine's color
        assert re.search(rf"fill: {color}[^>]*>{engine}</text>", svg), engine
    assert "occupancy_saturated" in svg  # the title says which occupancy is drawn
    _check_written(plot_batched_bars(folders, tmp_path / "batched"))
    _check_written(plot_occupancy_timeline(folders, tmp_path / "timeline"))
    svg = _check_written(plot_latency_cdfs(folders, tmp_path / "cdf"))
    assert "TTFT" in svg and "TPOT" in svg and "E2EL" in svg
    with pytest.raises(PlotSkipped, match="memory columns"):
        plot_memory_timeline(folders, tmp_path / "memory")
    with pytest.raises(PlotSkipped, match="roofline_s"):
        plot_roofline(folders, tmp_path / "roofline")


def test_collector_columns_draw_memory_and_roofline(real_like, tmp_path):
    svg = _check_written(plot_memory_timeline([real_like], tmp_path / "memory"))
    for column in (
        "torch_allocated_bytes",
        "torch_reserved_bytes",
        "nvml_used_bytes",
        "KV arena (arena_bytes)",
    ):
        assert column in svg
    _check_written(plot_roofline([real_like], tmp_path / "roofline"))
    (run,) = as_runs([real_like])
    start, _, efficiency = roofline_efficiency(run)
    decode = run.steps["kind"] == "decode"
    assert len(start) == decode.sum() > 0
    assert np.allclose(efficiency, 0.5)  # roofline_s was half of each row's duration


def test_step_series_keeps_the_time_weighted_mean():
    rng = np.random.default_rng(0)
    duration = rng.uniform(0.01, 1.0, 5000)
    start = np.cumsum(duration) - duration + np.repeat([0.0, 7.0], 2500)  # an idle gap in the middle
    values = rng.integers(0, 100, (5000, 2)).astype(float)
    x, y = step_series(start, duration, values, max_points=300)
    assert len(x) == 301 and y.shape == (301, 2)
    widths = np.diff(x)
    exact_widths = np.diff(np.append(start, start[-1] + duration[-1]))
    assert np.allclose(widths @ y[:-1], exact_widths @ values)  # the integral is exact
    short_x, short_y = step_series(start[:10], duration[:10], values[:10, 0])
    assert np.array_equal(short_x[:-1], start[:10]) and short_y[-1] == values[9, 0]


def test_sweep_figures_render_from_saved_files(sweep_dir, tmp_path):
    sweep = load_sweep(sweep_dir)
    svg = _check_written(plot_latency_vs_rate(sweep_dir, tmp_path / "latency"))
    assert "sustained rate" in svg and "paged" in svg and "block size 16" in svg
    _check_written(plot_batched_vs_rate(sweep, tmp_path / "batched"))
    svg = _check_written(plot_block_size(sweep, tmp_path / "block"))
    assert "paged, 4 req/s" in svg and "orca-max" not in svg  # contiguous engines have no block size


def test_block_size_figure_needs_two_block_sizes(sweep_dir, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    with open(sweep_dir / "sweep.csv", newline="") as f:
        rows = [r for r in csv.reader(f) if r[2] != "32"]
    with open(one / "sweep.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(PlotSkipped, match="fewer than two block sizes"):
        plot_block_size(one, tmp_path / "block")
    _check_written(plot_latency_vs_rate(one, tmp_path / "latency"))  # no sustained.csv: still drawn


def _images(page: str) -> list[str]:
    return re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', page)


@pytest.fixture(scope="module")
def combined(runs_dir, sweep_dir, real_like) -> Path:
    """One report (default --out: the first DIR's report/) of a folder of runs, a sweep, a real-like run."""
    proc = kvbench("report", str(runs_dir), str(sweep_dir), str(real_like))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"report: {runs_dir / 'report' / 'report.html'}\n")
    return runs_dir / "report"


def test_report_tables_environment_and_commands(combined, runs_dir, sweep_dir):
    page = (combined / "report.html").read_text()
    for engine in ENGINES:
        assert f"{engine}</td>" in page
    env = json.loads((runs_dir / "paged" / "env.json").read_text())
    assert f"<td>{html.escape(env['platform'])}</td>" in page  # the environment, once for all runs
    assert html.escape(shlex.join(env["command"])) in page  # the exact command
    md = (combined / "report.md").read_text()
    summary = json.loads((runs_dir / "paged" / "summary.json").read_text())
    latency = significant(summary["normalized_latency_s"])  # a time: kvbench.report.format's digits
    assert re.search(rf"^\| runs\d*/paged \| paged \| simulated \| 24/24 \|.*\| {latency} \|", md, re.M), md
    assert (combined / "plots" / "occupancy.svg").is_file() and "plots/occupancy.png" in md
    assert f"## Sweep `{sweep_dir.resolve()}`" in md and "plots/sweep_block_size.svg" in md
    assert "## Commands" in md


def test_report_inlines_every_figure(combined, sweep_dir):
    page = (combined / "report.html").read_text()
    assert (
        len(_images(page)) == 6 + 3
    )  # every run figure (one run has memory and roofline columns), every sweep's
    assert "13 cells (1 failed, 12 ok)" in page and "Sustained rates" in page
    assert "roofline_efficiency" in page  # an optional summary key shows up when present
    assert not (sweep_dir / "report").exists()


def test_report_of_summaries_alone_notes_what_it_cannot_draw(runs_dir, tmp_path):
    run = tmp_path / "paged"
    run.mkdir()
    shutil.copy(runs_dir / "paged" / "summary.json", run)  # no steps.csv, requests.csv, config, env
    proc = kvbench("report", str(run), "--out", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    assert len(_images(page)) == 2  # Figures 2 and 13 need only summary.json
    for title in ("Occupancy over time", "Latency CDFs", "Physical memory over time"):
        assert f"<b>{title}</b>: not drawn" in page, title


def test_compare_side_by_side(runs_dir):
    proc = kvbench("compare", str(runs_dir / "paged"), str(runs_dir / "orca-max"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["paged", "orca-max"]  # the order given
    summaries = [json.loads((runs_dir / e / "summary.json").read_text()) for e in ("paged", "orca-max")]
    token_states = [f"{100 * s['occupancy_saturated']['token_states']:.1f}" for s in summaries]
    assert next(line for line in lines if line.startswith("token states %")).split()[-2:] == token_states
    preemptions = next(line for line in lines if line.startswith("preemptions")).split()[-2:]
    assert preemptions == [str(s["num_preemptions"]) for s in summaries]
    for key in summaries[0]:  # percentiles and goodput, where the metrics write them, get a row each
        if key.startswith(("p50_", "p99_", "goodput")):
            assert any(line.startswith(f"{key} ") for line in lines), key
    md = kvbench("compare", "--markdown", str(runs_dir))
    assert md.returncode == 0, md.stderr
    assert md.stdout.splitlines()[0] == "|  | " + " | ".join(ENGINES) + " |"
    assert md.stdout.splitlines()[1].startswith("|---|")


def test_compare_lists_the_cells_of_a_sweep(sweep_dir):
    proc = kvbench("compare", str(sweep_dir))
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()[0].split()) == 12  # one column per cell with results


@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_folder_without_results_is_a_one_line_error(tmp_path, command):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        proc = kvbench(command, str(path))
        assert proc.returncode == 2
        assert proc.stderr == f"error: {path}: {ERROR}\n"


def test_a_broken_summary_is_a_one_line_error(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{not json")
    proc = kvbench("compare", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {tmp_path / 'run' / 'summary.json'}: not valid JSON")
    assert proc.stderr.count("\n") == 1


def test_a_ragged_steps_file_is_a_one_line_error(runs_dir, tmp_path):
    run = tmp_path / "paged"
    shutil.copytree(runs_dir / "paged", run)
    with open(run / "steps.csv", "a") as f:
        f.write("1,2,3\n")
    text = (run / "steps.csv").read_text()
    lines, columns = text.count("\n"), text.split("\n")[0].count(",") + 1
    proc = kvbench("report", str(run))
    assert proc.returncode == 2
    assert proc.stderr == f"error: {run / 'steps.csv'}: line {lines} has 3 cells, the header {columns}\n"


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.skipif(
    _chromium() is None, reason="no chromium binary (apt-get install chromium); .ci/run installs it"
)
def test_report_renders_in_a_browser(combined, tmp_path):
    page = combined / "report.html"
    browser = subprocess.run(
        [_chromium(), "--headless=new", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert browser.returncode == 0, browser.stderr[-2000:]
    body = re.search(r"<body[^>]*>", browser.stdout)
    assert body, browser.stdout[:500]
    expected = len(_images(page.read_text()))
    assert expected > 0
    assert f'data-image-count="{expected}"' in body.group(0)
    assert 'data-images="ok"' in body.group(0)
    console = [line for line in browser.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
