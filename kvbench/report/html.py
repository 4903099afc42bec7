"""The report's two renderings: one self-contained HTML page and a Markdown summary.

The HTML page needs nothing beside itself: figures are inlined as base64 PNG (the SVG twins
in `plots/` are linked for print quality), styles are inline, and a few lines of script
mark `<body data-images="ok">` once every image has decoded, which is what the browser test
reads. Every string from the results (labels, paths, commands) is escaped.
"""

from __future__ import annotations

import base64
import html
import json
import math
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from kvbench.paper import FIG2_OCCUPANCY, FIG13_BATCHED, FIG13_RATE, PAPER_NAMES
from kvbench.report.figures import Figure
from kvbench.report.style import engine_colors
from kvbench.report.tables import KEY_METRICS, Results, markdown_table, metric_table, optional_metrics
from kvbench.results.files import read_json
from kvbench.results.load import Run, Sweep

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; }
body { color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.scroll { overflow-x: auto; } .meta, .note { color: #666; }
.sw { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em; border-radius: 2px; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; } pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
"""
_CHECK = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var ok = images.every(function (img) { return img.complete && img.naturalWidth > 0; });
  document.body.dataset.imageCount = String(images.length);
  document.body.dataset.images = ok ? "ok" : "broken";
});
"""


def _e(text) -> str:
    return html.escape(str(text))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], colors: dict[str, str] | None = None) -> str:
    """An HTML table; with `colors`, a cell naming an engine gets its color swatch."""

    def cell(text: str) -> str:
        swatch = (
            f'<span class="sw" style="background:{colors[text]}"></span>' if colors and text in colors else ""
        )
        return f"<td>{swatch}{_e(text)}</td>"

    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _figure_html(figure: Figure, out: Path) -> str:
    if not figure.paths:
        return f'<p class="note"><b>{_e(figure.title)}</b>: not drawn — {_e(figure.note)}.</p>'
    png = next(p for p in figure.paths if p.suffix == ".png")
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    links = " · ".join(
        f'<a href="{_e(p.relative_to(out).as_posix())}">{p.suffix[1:].upper()}</a>' for p in figure.paths
    )
    return (
        f'<figure id="{_e(figure.name)}"><img alt="{_e(figure.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(figure.title)} ({links})</figcaption></figure>"
    )


def _pair(ours: str, paper: float | None) -> str:
    return f"{ours} ({paper:.1f})" if paper is not None and ours != "-" else ours


def paper_rows(runs: Sequence[Run]) -> tuple[list[str], list[list[str]]]:
    """Runs of the paper's OPT-13B setting beside Figures 2 and 13 (paper's number in parentheses)."""
    occ = {m.header: m for m in KEY_METRICS}
    header = ["run", "engine", "paper name", "batched mean", "token states %", "reservation %",
              "internal frag. %", "ext. frag. & other %"]  # fmt: skip
    rows = []
    for run in runs:
        budget_gib = float(run.summary.get("kv_budget_bytes") or 0) / 2**30
        if (
            run.summary.get("model") != "opt-13b"
            or run.engine not in PAPER_NAMES
            or abs(budget_gib - 12) > 0.5
        ):
            continue  # not the paper's setting (OPT-13B, 12 GB of KV)
        trace = str(run.summary.get("trace"))
        rate_ok = run.rate is not None and trace in FIG13_RATE and math.isclose(run.rate, FIG13_RATE[trace])
        batched = FIG13_BATCHED.get(trace, {}).get(run.engine) if rate_ok else None
        fig2 = FIG2_OCCUPANCY.get(run.engine, {})
        rows.append([
            run.label, run.engine, PAPER_NAMES[run.engine], _pair(occ["batched mean"].get(run), batched),
            *(_pair(occ[f"{name} %"].get(run), fig2.get(key)) for name, key in (
                ("token states", "token_states"), ("reservation", "reservation"),
                ("internal frag.", "internal_frag"), ("ext. frag. & other", "other"))),
        ])  # fmt: skip
    return header, rows


def _flatten(data: dict, prefix: str = "") -> dict[str, str]:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if not isinstance(value, str) else value
    return flat


def settings(runs: Sequence[Run], what: str) -> tuple[list[list[str]], tuple[list[str], list[list[str]]]]:
    """config.json or env.json of the runs: (entries equal in every run, table of those that differ)."""
    flats = [_flatten(_shown(r, what)) for r in runs]
    keys = [
        k for k in dict.fromkeys(k for flat in flats for k in flat) if k not in ("command", "created_utc")
    ]
    same = [k for k in keys if len({flat.get(k) for flat in flats}) == 1]
    differ = [k for k in keys if k not in same]
    common = [[k, flats[0][k]] for k in same]
    rows = [[r.label, *(flat.get(k, "-") for k in differ)] for r, flat in zip(runs, flats, strict=True)]
    return common, (["run", *differ], rows if differ else [])


def _shown(run: Run, what: str) -> dict:
    """config.json or env.json as the settings table shows it: a simulated run's config without
    the real-run settings (device, dtype, attention, ...), which it never used."""
    from kvbench.flags import RealOptions

    data = getattr(run, what)
    if what != "config" or run.summary.get("mode") == "real":
        return data
    real_only = {f.name for f in fields(RealOptions)}
    return {key: value for key, value in data.items() if key not in real_only}


def _settings_html(runs: Sequence[Run], what: str, colors: dict[str, str]) -> str:
    common, (header, rows) = settings(runs, what)
    parts = [_table(header, rows, colors)] if rows else []
    if common:
        parts.append(_table(["same in every run", "value"], common))
    return "".join(parts)


def commands(results: Results) -> list[tuple[str, list[str]]]:
    """Each distinct command line from env.json, with the runs it produced."""
    envs = [(r.label, r.env) for r in results.all_runs()]
    envs += [(f"sweep {s.path.name}", _sweep_env(s)) for s in results.sweeps]
    seen: dict[str, list[str]] = {}
    for label, env in envs:
        command = env.get("command")
        if command:
            line = shlex.join(map(str, command)) if isinstance(command, list) else str(command)
            seen.setdefault(line, []).append(label)
    return list(seen.items())


def _some(labels: Sequence[str], shown: int = 6) -> str:
    """`a, b, c and 97 more`: the runs a command produced, without listing a whole sweep."""
    rest = len(labels) - shown
    return ", ".join(labels[:shown]) + (f" and {rest} more" if rest > 0 else "")


def _sweep_env(sweep: Sweep) -> dict:
    """A sweep's own env.json (the sweep command), where the sweep wrote one."""
    return read_json(sweep.path / "env.json")


def _sweep_tables(sweep: Sweep) -> tuple[str, list[list[str]], tuple[list[str], list[list[str]]]]:
    """(status line, cell rows, sustained table) of a sweep."""
    header = [str(c) for c in sweep.cells.columns]
    rows = [[_cell(v) for v in row] for row in sweep.cells.itertuples(index=False)]
    status = Counter(sweep.strings("status", "?")) if "status" in sweep.cells else Counter()
    line = f"{sweep.num_cells} cells" + (
        " (" + ", ".join(f"{n} {s}" for s, n in sorted(status.items())) + ")" if status else ""
    )
    s_header = [str(c) for c in sweep.sustained.columns]
    s_rows = [[_cell(v) for v in row] for row in sweep.sustained.itertuples(index=False)]
    return line, [header, *rows], (s_header, s_rows)


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def render_html(results: Results, figures: list[Figure], sweep_figures: list[list[Figure]], out: Path,
                created: str) -> str:  # fmt: skip
    runs = list(results.runs)
    colors = engine_colors(r.engine for r in results.all_runs())
    parts = [f"<h1>kvbench report</h1><p class='meta'>Generated {_e(created)} from "
             + ", ".join(f"<code>{_e(p)}</code>" for p in results.inputs)
             + f": {len(runs)} runs, {len(results.sweeps)} sweeps. Every number and figure is read from "
             "the saved results (summary.json, steps.csv, requests.csv, sweep.csv).</p>"]  # fmt: skip
    if runs:
        header, rows = metric_table(runs, [*KEY_METRICS, *optional_metrics(runs)])
        parts.append("<h2 id='runs'>Runs</h2>" + _table(header, rows, colors))
        parts.append("<p class='note'>Occupancy is time-weighted over each run's saturated steps (a request "
                     "waited for memory: the paper's Figure 2) where it ever saturated, else over busy time; "
                     "batched requests are time-weighted over busy time (Figure 13).</p>")  # fmt: skip
        p_header, p_rows = paper_rows(runs)
        if p_rows:
            parts.append("<h2 id='paper'>Beside the paper</h2><p class='note'>kvbench's number, the "
                         "PagedAttention paper's in parentheses (OPT-13B, 12 GB KV on an A100-40GB; "
                         "Figure 13 only at its rate).</p>" + _table(p_header, p_rows, colors))  # fmt: skip
        parts.append("<h2 id='figures'>Figures</h2>" + "".join(_figure_html(f, out) for f in figures))
    for sweep, figs in zip(results.sweeps, sweep_figures, strict=True):
        line, cells, (s_header, s_rows) = _sweep_tables(sweep)
        parts.append(f"<h2>Sweep <code>{_e(sweep.path)}</code></h2><p>{_e(line)}</p>")
        if s_rows:
            parts.append("<h3>Sustained rates (sustained.csv)</h3>" + _table(s_header, s_rows, colors))
        parts.append("".join(_figure_html(f, out) for f in figs))
        every = _table(cells[0], cells[1:], colors)
        parts.append(f"<details><summary>Every cell (sweep.csv)</summary>{every}</details>")
    if runs:
        header, rows = metric_table(runs, optional_metrics(runs, everything=True))
        parts.append("<h2 id='settings'>Settings and summaries</h2>")
        parts.append("<details open><summary>Settings (config.json): those that differ first</summary>"
                     + _settings_html(runs, "config", colors) + "</details>")  # fmt: skip
        parts.append("<details><summary>Every number in summary.json</summary>" + _table(header, rows, colors)
                     + "</details>")  # fmt: skip
        parts.append("<h2 id='environment'>Environment (env.json)</h2>" + _settings_html(runs, "env", colors))
    parts.append("<h2 id='commands'>Commands</h2>")
    for line, labels in commands(results):
        parts.append(f"<p class='note'>{_e(_some(labels))}</p><pre>{_e(line)}</pre>")
    body = "\n".join(parts)
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>kvbench report</title>"
        f"<style>{_STYLE}</style></head>\n<body>\n{body}\n<script>{_CHECK}</script>\n</body></html>\n"
    )


def _figure_md(figure: Figure, out: Path) -> str:
    if not figure.paths:
        return f"- {figure.title}: not drawn ({figure.note})"
    links = " · ".join(f"[{p.suffix[1:].upper()}]({p.relative_to(out).as_posix()})" for p in figure.paths)
    return f"- {figure.title}: {links}"


def render_markdown(results: Results, figures: list[Figure], sweep_figures: list[list[Figure]], out: Path,
                    created: str) -> str:  # fmt: skip
    runs = list(results.runs)
    inputs = ", ".join(f"`{p}`" for p in results.inputs)
    parts = [f"# kvbench report\n\nGenerated {created} from {inputs}: {len(runs)} runs, "
             f"{len(results.sweeps)} sweeps. The page with the figures inline: `report.html`."]  # fmt: skip
    if runs:
        parts.append("## Runs\n\n" + markdown_table(*metric_table(runs, KEY_METRICS)))
        p_header, p_rows = paper_rows(runs)
        if p_rows:
            parts.append("## Beside the paper\n\nkvbench's number, the paper's in parentheses.\n\n"
                         + markdown_table(p_header, p_rows))  # fmt: skip
        parts.append("## Figures\n\n" + "\n".join(_figure_md(f, out) for f in figures))
    for sweep, figs in zip(results.sweeps, sweep_figures, strict=True):
        line, _, (s_header, s_rows) = _sweep_tables(sweep)
        parts.append(f"## Sweep `{sweep.path}`\n\n{line}.")
        if s_rows:
            parts.append("Sustained rates:\n\n" + markdown_table(s_header, s_rows))
        parts.append("\n".join(_figure_md(f, out) for f in figs))
    lines = [f"# {_some(labels)}\n{line}" for line, labels in commands(results)]
    if lines:
        parts.append("## Commands\n\n```sh\n" + "\n".join(lines) + "\n```")
    return "\n\n".join(parts) + "\n"
