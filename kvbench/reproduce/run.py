"""`kvbench reproduce`: run the paper's figures, put every number beside the paper's.

    <out>/<figure>/seed-<s>/  one seed's run or sweep folders and plots (seeds seed .. seed+repeats-1)
    <out>/<figure>/     figure.csv, figure.json: every number a mean over the seeds with its 95 % CI
    <out>/claims.md     PAPER.md's claims beside what the figures measured
    <out>/reproduce.md  every figure's table and a one-line verdict computed from its numbers
    <out>/calibration/  real runs: the simulator fitted to Figure 2's runs, its error on Figures 12-17's

The report and the claims are rebuilt from every figure.json under <out> after each run, so
figures may be run one invocation at a time into one folder. See docs/REPRODUCTION.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvbench.calibrate.fit import model_of, read_cost_file
from kvbench.demo import REAL
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_distinct
from kvbench.paper import FIG13_RATE
from kvbench.reproduce.calibration import calibrate_reproduction, held_out_markdown, read_held_out
from kvbench.reproduce.claims import claims_table
from kvbench.reproduce.engines import fig2, fig2_verdict, fig13, fig13_verdict
from kvbench.reproduce.plots import plot_seed_intervals
from kvbench.reproduce.rows import (
    SEED_PREFIX,
    FigureResult,
    Options,
    Row,
    Setting,
    markdown,
    merge_seeds,
    read_figure,
    seed_folder,
    write_figure,
)
from kvbench.reproduce.sharing import (
    fig14,
    fig14_verdict,
    fig15,
    fig15_verdict,
    fig16,
    fig16_verdict,
    fig17,
    fig17_verdict,
)
from kvbench.reproduce.sweeps import (
    fig12,
    fig12_sweeps,
    fig12_verdict,
    fig18b,
    fig18b_verdict,
    fig19,
    fig19_verdict,
    plot_into,
)
from kvbench.results.files import read_json, write_text
from kvbench.results.outputs import MARKER, prepare_out
from kvbench.sweep.progress import Progress


@dataclass(frozen=True)
class FigureSpec:
    name: str
    what: str
    run: Callable[[Options, Path], FigureResult]  # one seed into one folder
    verdict: Callable[[Sequence[Row], Options], str]  # the figure's rows (over seeds) judged


FIGURES = {
    spec.name: spec
    for spec in (
        FigureSpec("fig2", "KV memory breakdown per engine", fig2, fig2_verdict),
        FigureSpec("fig13", "mean batched requests, ShareGPT and Alpaca", fig13, fig13_verdict),
        FigureSpec(
            "fig12", "normalized latency vs rate, sustained rates and their ratios", fig12, fig12_verdict
        ),
        FigureSpec(
            "fig14", "parallel sampling and beam search: sustained rates (Alpaca)", fig14, fig14_verdict
        ),
        FigureSpec("fig15", "KV memory saved by parallel sampling and beam search", fig15, fig15_verdict),
        FigureSpec("fig16", "shared few-shot prefix: sustained rates", fig16, fig16_verdict),
        FigureSpec("fig17", "chatbot (history cut to 1024 tokens): sustained rates", fig17, fig17_verdict),
        FigureSpec("fig18b", "normalized latency vs block size (paged)", fig18b, fig18b_verdict),
        FigureSpec("fig19", "preemption by recompute vs swap, overhead vs block size", fig19, fig19_verdict),
    )
}
CLAIMS = "claims"  # not a figure: claims.md is written after every invocation
NAMES = (*FIGURES, CLAIMS)


def parse_figures(names: Sequence[str]) -> tuple[str, ...]:
    """The figures asked for, in the registry's order; none named: all of them. A figure named
    twice is refused as a flag's value given twice is (`flag_ranges.check_distinct`): it runs
    once, so the command would do less than its line reads."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise KvbenchError(f"unknown figure {unknown[0]!r}; choose from {', '.join(NAMES)}")
    check_distinct("figures", list(names))
    wanted = set(names) or set(FIGURES)
    return tuple(n for n in FIGURES if n in wanted)


# Real runs' settings: a model whose KV arena holds 16,384 token slots, as the paper's OPT-13B
# with 12 GB holds 15,728 (so the engines batch as the paper's did), and the paper's rates times
# how much faster that model decodes on this GPU than OPT-13B on an A100 (so the same engines are
# saturated). OPT-125M decodes the saturated ShareGPT runs 2.5-2.8x faster than OPT-1.3B on the
# H200 with the same batches and occupancy (results/reference/quick-opt-125m): the quick run's model.
GPU_SETTINGS = {
    "opt-125m": Setting("opt-125m", 0.5625, 80.0, paper_threshold=False),
    "opt-1.3b": Setting("opt-1.3b", 3.0, REAL["rate"] / FIG13_RATE["sharegpt-paper"], paper_threshold=False),
    # the paper's own setting: 12 GiB of OPT-13B KV is exactly its 15,728 token slots; rates x 3.0,
    # the A100-40GB roofline's OPT-13B decode step at batch 32, context 512 (35.9 ms) over the
    # H200's measured 11.8 ms (results/reference/real-decode-kernels/decode_step.json)
    "opt-13b": Setting("opt-13b", 12.0, 3.0, paper_threshold=False),
}
QUICK_GPU_MODEL = "opt-125m"  # a quick run on one H200: minutes
FULL_GPU_MODEL = "opt-1.3b"  # the full grids: a prefill-to-decode cost balance nearer OPT-13B's


def setting_for(real: bool, cost_model: str | None, *, quick: bool, model: str | None = None) -> Setting:
    """The paper's setting when simulating; a scaled-down GPU one (`GPU_SETTINGS`) when real.

    A calibrated cost model was fitted on some model's real runs: simulating that model's
    GPU setting is what makes the simulation calibrated.
    """
    if real:
        if cost_model is not None:
            raise KvbenchError("--cost-model calibrates the simulator: it does not apply to --mode real")
        name = model or (QUICK_GPU_MODEL if quick else FULL_GPU_MODEL)
        if name not in GPU_SETTINGS:
            raise KvbenchError(f"--model {name!r}: real runs use one of {', '.join(GPU_SETTINGS)}")
        return replace(GPU_SETTINGS[name], real=True)
    if model is not None:
        raise KvbenchError(
            "--model picks the real runs' model; a simulation runs opt-13b, or the model its --cost-model "
            "was fitted on"
        )
    if cost_model is None:
        return Setting()
    fitted = model_of(read_cost_file(cost_model, "--cost-model"), f"--cost-model {cost_model}")
    if fitted in GPU_SETTINGS:  # fitted on that model's real runs: its GPU setting, rates and bound
        return replace(GPU_SETTINGS[fitted], cost_model=cost_model)
    raise KvbenchError(
        f"--cost-model {cost_model}: fitted on {fitted}; reproduce simulates opt-13b or "
        f"{', '.join(GPU_SETTINGS)}"
    )


def placement_for(setting: Setting, place_with: str | None) -> Setting:
    """`setting` with its real rate figures placed by `place_with`, a cost file fitted on the
    same model's real runs (checked: a file of another model would place every rate wrongly)."""
    if place_with is None:
        return setting
    if not setting.real:
        raise KvbenchError("--place-with places real runs: use it with --mode real (or auto on a GPU)")
    fitted = model_of(read_cost_file(place_with, "--place-with"), f"--place-with {place_with}")
    if fitted != setting.model:
        raise KvbenchError(
            f"--place-with {place_with}: fitted on {fitted}, the real runs decode {setting.model}"
        )
    return replace(setting, placement=place_with)


def run_reproduce(
    figures: Sequence[str], options: Options, out: Path, echo: Callable[[str], None] = print
) -> list[FigureResult]:
    """Run `figures` into `out`; then rewrite claims.md and reproduce.md from every figure there.

    A previous reproduction in `out` is resumed (its runs are reused); any other folder is
    refused before the first run (`kvbench.results.outputs`).
    """
    prepare_out(out, "reproduce")
    if options.setting.place_only:
        return place_only(figures, options, out, echo)
    results = []
    progress = Progress(len(figures), unit="figures", label="reproduce")  # each sweep's cells below it
    try:
        for name in figures:
            echo(f"{name}: {FIGURES[name].what}...")
            progress.begin(name)
            start = time.perf_counter()
            result = run_seeds(FIGURES[name], options, out / name)
            write_figure(result, out / name)
            progress.finish(True, time.perf_counter() - start)
            echo(f"  {result.verdict} ({time.perf_counter() - start:.0f} s)")
            results.append(result)
    finally:
        progress.close()
    if options.setting.real:
        _calibrate(out, echo)
    write_reports(out, options)
    return results


def rejudge(
    figures: Sequence[str], options: Options, out: Path, echo: Callable[[str], None], *, named: bool
) -> list[FigureResult]:
    """`--rejudge`: judge the figures already in `out` again by today's verdict rules, from the
    rows their figure.json holds (means and intervals as written; no run, no calibration), and
    rewrite their verdicts, reproduce.md and claims.md. `named`: the figures were named (each
    must be there), else every figure found is judged.

    Why: a verdict rule tightened since a reproduction ran (a match too wide to tell the paper's
    value from half or twice it) applies to its committed figures without re-running hours of
    GPU work; the rows, the measurement, are untouched."""
    if read_json(out / MARKER).get("kind") != "reproduce":
        raise KvbenchError(f"--rejudge: {out} is not a folder kvbench reproduce wrote (its {MARKER})")
    results = []
    for name in figures:
        found = read_figure(out / name)
        if found is None:
            if named:
                raise KvbenchError(f"--rejudge: {out / name} holds no figure.json to judge")
            continue
        result = replace(found, verdict=FIGURES[name].verdict(found.rows, options))
        if result.verdict != found.verdict:
            write_figure(result, out / name)
        echo(f"{name}: {result.verdict}")
        results.append(result)
    if not results:
        raise KvbenchError(f"--rejudge: {out} holds no figure to judge")
    # the reports' setting line names the seeds the rows were merged over, not the flags' defaults
    merged = max((row.n or 1 for r in results for row in r.rows), default=1)
    first = first_seed(out, [r.name for r in results])
    seed = options.seed if first is None else first
    write_reports(out, replace(options, seed=seed, repeats=max(options.repeats, merged)))
    return results


def first_seed(out: Path, figures: Sequence[str]) -> int | None:
    """The lowest seed the figures in `out` ran (their `seed-<s>/` folders); None where none
    has one (written before seeds had folders). `--rejudge` reads it from the folder: the rows
    were run on it, whatever `--seed` would say."""
    seeds = [
        int(found.name[len(SEED_PREFIX) :])
        for name in figures
        if (found := seed_folder(out / name)) != out / name
    ]
    return min(seeds, default=None)


def place_only(figures: Sequence[str], options: Options, out: Path, echo: Callable[[str], None]) -> list:
    """`--place-only`: the placement simulations of Figure 12's real runs for every seed, on
    this machine (a CPU), so a later real invocation on a GPU finds them finished and spends its
    time on real runs only. Nothing else is written: no figure, report or calibration."""
    if list(figures) != ["fig12"]:
        raise KvbenchError("--place-only places Figure 12's real runs: name fig12 alone")
    for s in seeds(options):
        echo(f"fig12, seed {s}: placing...")
        for _ in fig12_sweeps(replace(options, seed=s), seed_folder(out / "fig12", s)):
            pass  # each sweep places its runs and stops
    return []


def seeds(options: Options) -> range:
    return range(options.seed, options.seed + options.repeats)


def run_seeds(spec: FigureSpec, options: Options, folder: Path) -> FigureResult:
    """The figure once per seed, each into its own `seed-<s>/` (a seed's finished runs there are
    reused), its rows merged into means with 95 % CIs and judged again over the seeds.

    Each seed draws another trace sample and other arrivals; the plots are the first seed's.
    """
    results = [spec.run(replace(options, seed=s), seed_folder(folder, s)) for s in seeds(options)]
    first = results[0]
    rows = merge_seeds([r.rows for r in results])
    prefix = f"{seed_folder(folder, options.seed).name}/"
    notes = [n for r in results for n in r.notes]
    notes = list(dict.fromkeys(notes))
    if options.repeats > 1:
        notes.append(
            f"{options.repeats} seeds ({options.seed}-{options.seed + options.repeats - 1}): each number "
            f"is a mean with its 95 % t interval over the seeds; the plots are seed {options.seed}'s"
        )
    plots = [prefix + p for p in first.plots]
    if options.repeats > 1:
        plots += plot_into(plot_seed_intervals, rows, folder / "intervals", notes)
    return FigureResult(
        first.name, first.title, rows, spec.verdict(rows, options), tuple(plots), tuple(notes)
    )


def _calibrate(out: Path, echo: Callable[[str], None]) -> None:
    """Fit the simulator to this folder's Figure 2 runs and check it on the others. A failure
    is reported in one line, never lost figures: the report is written either way."""
    start = time.perf_counter()
    try:
        sets = calibrate_reproduction(out)
    except (KvbenchError, OSError, ValueError, KeyError) as error:
        echo(f"calibration: skipped ({error.__class__.__name__}: {error})")
        return
    if sets is None:
        echo("calibration: not yet (it needs Figure 2's five real runs in this folder)")
        return
    spread = "; ".join(
        f"{s.label} {metric} {m['loaded']['within_target']}/{m['loaded']['runs']} loaded runs within 10 %"
        for s in sets
        for metric, m in s.summary.items()
    ) or "no real run of Figures 12-17 here to hold out"  # fmt: skip
    echo(f"calibration: fitted on fig2; {spread} ({time.perf_counter() - start:.0f} s)")


def collected(out: Path) -> list[FigureResult]:
    return [r for name in FIGURES if (r := read_figure(out / name)) is not None]


def write_reports(out: Path, options: Options) -> None:
    found = collected(out)
    rows = [row for figure in found for row in figure.rows]
    claims = claims_table(rows)
    write_text(out / "claims.md", f"# PAPER.md's claims beside kvbench\n\n{_setup(options)}\n\n{claims}\n")
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
    held_out = read_held_out(out)
    if held_out:
        parts.append(
            "\n## The calibrated simulator against the real runs\n\n"
            "The cost model fitted to Figure 2's five runs (`calibration/cost.json`), replaying the real "
            "runs of Figures 12-17 in this folder (`calibration/held_out*.md`). Target: within 10 %.\n\n"
            f"{held_out_markdown(held_out)}"
        )
    parts.append(f"\n## Claims\n\n{claims}\n")
    write_text(out / "reproduce.md", "\n".join(parts) + "\n")


def _setup(options: Options) -> str:
    s = options.setting
    mode = "real decoding on a CUDA GPU" if s.real else "simulated (roofline of an A100-40GB)"
    if s.real and s.prefill_graphs:
        mode += ", short prefills replayed as CUDA graphs (--prefill-graphs)"
    if s.cost_model and not s.real:
        mode = f"simulated with the calibrated cost model {s.cost_model}"
    size = "quick" if options.quick else "full"
    runs = f"seed {options.seed}" if options.repeats == 1 else (
        f"seeds {options.seed}-{options.seed + options.repeats - 1} (means with 95 % CIs)"
    )  # fmt: skip
    return (
        f"Setting: {s.model}, {s.kv_cache_gib:g} GiB of KV, the paper's rates x {s.rate_scale:g}; {mode}; "
        f"{size} run, {runs}. The paper: OPT-13B on an A100-40GB with 12 GB of KV."
    )
