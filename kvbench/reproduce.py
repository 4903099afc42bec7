"""`kvbench reproduce`: run the paper's figures, put every number beside the paper's.

    <out>/<figure>/     run or sweep folders, figure.csv, figure.json, PNG/SVG plots
    <out>/claims.md     PAPER.md's claims beside what the figures measured
    <out>/reproduce.md  every figure's table and a one-line verdict computed from its numbers

The report and the claims are rebuilt from every figure.json under <out> after each run, so
figures may be run one invocation at a time into one folder. See docs/REPRODUCTION.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.demo import REAL
from kvbench.errors import KvbenchError
from kvbench.paper import FIG13_RATE
from kvbench.reproduce_claims import claims_table
from kvbench.reproduce_engines import fig2, fig13
from kvbench.reproduce_rows import FigureResult, Options, Setting, markdown, read_figure, write_figure
from kvbench.reproduce_sharing import fig14, fig15, fig16, fig17
from kvbench.reproduce_sweeps import fig12, fig18b, fig19


@dataclass(frozen=True)
class FigureSpec:
    name: str
    what: str
    run: Callable[[Options, Path], FigureResult]


FIGURES = {
    spec.name: spec
    for spec in (
        FigureSpec("fig2", "KV memory breakdown per engine", fig2),
        FigureSpec("fig13", "mean batched requests, ShareGPT and Alpaca", fig13),
        FigureSpec("fig12", "normalized latency vs rate, sustained rates and their ratios", fig12),
        FigureSpec("fig14", "parallel sampling and beam search: sustained rates (Alpaca)", fig14),
        FigureSpec("fig15", "KV memory saved by parallel sampling and beam search", fig15),
        FigureSpec("fig16", "shared few-shot prefix: sustained rates", fig16),
        FigureSpec("fig17", "chatbot (history cut to 1024 tokens): sustained rates", fig17),
        FigureSpec("fig18b", "normalized latency vs block size (paged)", fig18b),
        FigureSpec("fig19", "preemption by recompute vs swap, overhead vs block size", fig19),
    )
}
CLAIMS = "claims"  # not a figure: claims.md is written after every invocation
NAMES = (*FIGURES, CLAIMS)


def parse_figures(names: Sequence[str]) -> tuple[str, ...]:
    """The figures asked for, in the registry's order; none named: all of them."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise KvbenchError(f"unknown figure {unknown[0]!r}; choose from {', '.join(NAMES)}")
    wanted = set(names) or set(FIGURES)
    return tuple(n for n in FIGURES if n in wanted)


def setting_for(real: bool, cost_model: str | None) -> Setting:
    """The paper's setting when simulating; the demo's scaled-down one on a GPU.

    A calibrated cost model was fitted on some model's real runs: simulating that model's
    setting (the GPU one for the demo's model) is what makes the simulation calibrated.
    """
    gpu = Setting(REAL["model"], REAL["kv_cache_gib"], REAL["rate"] / FIG13_RATE["sharegpt-paper"])
    if real:
        if cost_model is not None:
            raise KvbenchError("--cost-model calibrates the simulator: it does not apply to --mode real")
        return Setting(gpu.model, gpu.kv_cache_gib, gpu.rate_scale, real=True, paper_threshold=False)
    if cost_model is None:
        return Setting()
    from kvbench.plots_data import read_json

    model = read_json(Path(cost_model)).get("model")
    if model in (None, "opt-13b"):
        return Setting(cost_model=cost_model)
    if model == gpu.model:
        return Setting(
            gpu.model, gpu.kv_cache_gib, gpu.rate_scale, cost_model=cost_model, paper_threshold=False
        )
    raise KvbenchError(
        f"--cost-model {cost_model}: fitted on {model}; reproduce simulates opt-13b or {gpu.model}"
    )


def run_reproduce(
    figures: Sequence[str], options: Options, out: Path, echo: Callable[[str], None] = print
) -> list[FigureResult]:
    """Run `figures` into `out`; then rewrite claims.md and reproduce.md from every figure there."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in figures:
        echo(f"{name}: {FIGURES[name].what}...")
        start = time.perf_counter()
        result = FIGURES[name].run(options, out / name)
        write_figure(result, out / name)
        echo(f"  {result.verdict} ({time.perf_counter() - start:.0f} s)")
        results.append(result)
    write_reports(out, options)
    return results


def collected(out: Path) -> list[FigureResult]:
    return [r for name in FIGURES if (r := read_figure(out / name)) is not None]


def write_reports(out: Path, options: Options) -> None:
    found = collected(out)
    rows = [row for figure in found for row in figure.rows]
    claims = claims_table(rows)
    (out / "claims.md").write_text(f"# PAPER.md's claims beside kvbench\n\n{_setup(options)}\n\n{claims}\n")
    parts = [
        f"# kvbench reproduce: the PagedAttention paper's figures\n\n{_setup(options)}\n",
        "## Verdicts\n",
    ]
    parts += [f"- **{f.name}** ({f.title}): {f.verdict}" for f in found]
    for figure in found:
        parts.append(f"\n## {figure.name}: {figure.title}\n\nVerdict: {figure.verdict}\n")
        parts += [f"![{figure.name}]({figure.name}/{p})" for p in figure.plots if p.endswith(".png")]
        parts.append("\n" + markdown(figure))
        parts += [f"\n- {note}" for note in figure.notes]
    parts.append(f"\n## Claims\n\n{claims}\n")
    (out / "reproduce.md").write_text("\n".join(parts) + "\n")


def _setup(options: Options) -> str:
    s = options.setting
    mode = "real decoding on a CUDA GPU" if s.real else "simulated (roofline of an A100-40GB)"
    if s.cost_model and not s.real:
        mode = f"simulated with the calibrated cost model {s.cost_model}"
    size = "quick" if options.quick else "full"
    return (
        f"Setting: {s.model}, {s.kv_cache_gib:g} GiB of KV, the paper's rates x {s.rate_scale:g}; {mode}; "
        f"{size} run. The paper: OPT-13B on an A100-40GB with 12 GB of KV."
    )
