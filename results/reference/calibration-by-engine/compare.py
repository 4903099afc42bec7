"""The OPT-13B cost model fitted on replayed-prefill runs, once for both engines and once by engine.

    PYTHONPATH=. python results/reference/calibration-by-engine/compare.py

Writes comparison.md beside this script from two `kvbench calibrate` files fitted on the same
runs (seed 0 of results/reference/fig12-alpaca-prefill-graphs: paged and orca-oracle, Alpaca,
OPT-13B, 15,728 slots, short prefills replayed as CUDA graphs) and holding out the same runs
(that folder's seeds 1 and 2): `pooled.json` (one set of constants for both engines) and
`cost.json` (`--by-engine`: each engine's own constants). Six tables:

- held-out runs within 10 % of the real run, loaded and unloaded apart, per metric, both fits;
- each loaded held-out run's normalized-latency error, signed (simulated over real, less 1);
- the constants of the three fits;
- why: the fitting runs' decode steps by batch (16-row bins), paged's median step against
  orca-oracle's at the same batch, from their steps.csv;
- each run's steps priced by its engine's fit over their measured time, fitted and held-out
  seeds side by side (`kvbench.calibrate.fit.priced_over_measured`);
- each loaded held-out run simulated again at its own step price (`at_own_price`): the error
  left once the steps cost what they cost in that run.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from pathlib import Path

from kvbench.calibrate.check import LOADS, TARGET, check
from kvbench.calibrate.fit import FITTED, priced_over_measured, read_rows
from kvbench.results.files import read_json, write_text
from kvbench.results.load import load_run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FITS = {"one fit of both engines": HERE / "pooled.json", "a fit by engine": HERE / "cost.json"}
METRICS = ("output_token_throughput", "normalized_latency_s", "mean_ttft_s")
ENGINES = ("orca-oracle", "paged")
BIN = 16  # decode rows per batch bin of the step table


def _percent(fraction: float, sign: str = "") -> str:
    return f"{fraction * 100:{sign}.1f} %"


def _cell(errors: list[float]) -> str:
    within = sum(abs(e) <= TARGET for e in errors)
    magnitudes = [abs(e) for e in errors]
    return (
        f"{within} of {len(errors)} | {_percent(statistics.median(magnitudes))} | {_percent(max(magnitudes))}"
    )


def _where(run: str) -> tuple[str, int, float]:
    """(engine, seed, rate) of a cell's folder name."""
    name = Path(run).name
    rate = float(re.search(r"__rate-([0-9.]+)__", name).group(1))
    return name.split("__")[0], int(re.search(r"__seed-(\d+)__", name).group(1)), rate


def _step_table(runs: list[str]) -> list[str]:
    """Median decode step (ms) per batch bin and engine over the fitting runs, and paged over orca-oracle."""
    import pandas as pd

    frames = []
    for run in runs:
        steps = load_run(ROOT / run).steps
        decode = steps[steps.kind == "decode"]
        frames.append(pd.DataFrame({
            "engine": _where(run)[0], "bin": (decode.batch_size // BIN) * BIN,
            "ms": 1e3 * decode.duration_s / decode.num_steps, "steps": decode.num_steps,
        }))  # fmt: skip
    table = pd.concat(frames).groupby(["bin", "engine"]).agg(ms=("ms", "median"), steps=("steps", "sum"))
    head = " | ".join(f"{e} steps | {e} median ms" for e in ENGINES)
    lines = [f"| decode rows | {head} | paged / orca-oracle |", "|---|---:|---:|---:|---:|---:|"]
    for low in sorted(table.index.get_level_values("bin").unique()):
        got = {e: table.loc[(low, e)] for e in ENGINES if (low, e) in table.index}
        shown = [f"{int(got[e].steps)} | {got[e].ms:.2f}" if e in got else "- | -" for e in ENGINES]
        ratio = f"{got['paged'].ms / got['orca-oracle'].ms:.3f}" if len(got) == 2 else "-"
        lines.append(f"| {int(low)}-{int(low) + BIN - 1} | {' | '.join(shown)} | {ratio} |")
    return lines


def _priced_table(by_engine: dict) -> list[str]:
    """Each run's steps priced by its engine's fit over their measured time
    (`priced_over_measured`), the fitting seed and the held-out ones side by side: how far one
    run's steps stray from the price of its engine's fitting runs, which a simulation of it
    inherits as a service rate."""
    held = {check["run"] for check in by_engine["held_out"]}
    ratio: dict[tuple[str, float], dict[int, float]] = {}
    for run in [*by_engine["runs"], *sorted(held)]:
        engine, seed, rate = _where(run)
        rows = read_rows(ROOT / run)
        ratio.setdefault((engine, rate), {})[seed] = priced_over_measured(rows, by_engine["engines"][engine])[
            "all"
        ]
    seeds = sorted({seed for by_seed in ratio.values() for seed in by_seed})
    lines = [
        "| engine | rate req/s | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|---:|" + "---:|" * len(seeds),
    ]
    for (engine, rate), by_seed in sorted(ratio.items()):
        shown = [f"{by_seed[s]:.3f}" if s in by_seed else "-" for s in seeds]
        lines.append(f"| {engine} | {rate:.4g} | {' | '.join(shown)} |")
    return lines


def at_own_price(by_engine: dict, run: str, ratio: float, folder: Path) -> dict[str, float]:
    """A held-out run simulated by its engine's fit scaled to the run's own step price: every
    fitted constant of the engine's section divided by `ratio` (the fit's price of the run's
    rows over their measured time), so the scaled fit prices the run's steps at exactly their
    measured total. What is left of the error then is not the steps' price but the rest of
    the simulation: arrivals, scheduling, preemption, the queue."""
    engine = _where(run)[0]
    own = dict(by_engine["engines"][engine])
    for name in (*FITTED, "per_row_above_knee_s"):
        if own.get(name):
            own[name] = own[name] / ratio
    path = folder / f"{engine}.json"
    path.write_text(json.dumps({**by_engine, "engines": {**by_engine["engines"], engine: own}}))
    return {c.metric: c.simulated for c in check(path, [ROOT / run])}  # as the held-out checks ran


def _own_price_table(by_engine: dict) -> list[str]:
    """Each loaded held-out run's errors with its engine's fit and with that fit at the run's own
    step price (`at_own_price`), and how many of them each puts within the target."""
    checks = {(c["run"], c["metric"]): c for c in by_engine["held_out"] if c["loaded"]}
    runs = sorted({run for run, _ in checks}, key=_where)
    metrics = ("normalized_latency_s", "mean_ttft_s")
    lines = [
        "| engine | seed | rate req/s | steps priced / measured | "
        + " | ".join(f"{m}: fit | at its own price" for m in metrics) + " |",
        "|---|---:|---:|---:|" + "---:|---:|" * len(metrics),
    ]  # fmt: skip
    within = {(m, which): 0 for m in metrics for which in ("fit", "own")}
    with tempfile.TemporaryDirectory() as scratch:
        for run in runs:
            engine, seed, rate = _where(run)
            rows = read_rows(ROOT / run)
            ratio = priced_over_measured(rows, by_engine["engines"][engine])["all"]
            simulated = at_own_price(by_engine, run, ratio, Path(scratch))
            shown = []
            for m in metrics:
                fit_error = checks[(run, m)]["error"]
                own_error = simulated[m] / checks[(run, m)]["real"] - 1
                within[(m, "fit")] += abs(fit_error) <= TARGET
                within[(m, "own")] += abs(own_error) <= TARGET
                shown += [_percent(fit_error, "+"), _percent(own_error, "+")]
            lines.append(f"| {engine} | {seed} | {rate:.4g} | {ratio:.3f} | {' | '.join(shown)} |")
    counts = "; ".join(
        f"{m}: {within[(m, 'fit')]} with the fit, {within[(m, 'own')]} at their own price" for m in metrics
    )
    return [*lines, "", f"Within {_percent(TARGET)} of the {len(runs)} loaded held-out runs: {counts}."]


def render() -> str:
    files = {label: read_json(path) for label, path in FITS.items()}
    by_fit = {label: {(c["run"], c["metric"]): c for c in data["held_out"]} for label, data in files.items()}
    keys = sorted(set.intersection(*(set(c) for c in by_fit.values())))
    labels = list(FITS)
    lines = [
        "# OPT-13B, replayed prefills: one fit of both engines against a fit by engine",
        "",
        "Written by `compare.py` from `pooled.json` and `cost.json` (both fitted on the same "
        f"{len(files[labels[0]]['runs'])} runs, both holding out the same "
        f"{len({run for run, _ in keys})}); within {_percent(TARGET)} of the real run.",
        "",
        "## Held out",
        "",
        "| load | metric | " + " | ".join(f"{label}: within | median | largest" for label in labels) + " |",
        "|---|---|" + "---:|---:|---:|" * len(labels),
    ]
    for load in LOADS:
        for metric in METRICS:
            chosen = [
                k for k in keys if k[1] == metric and (by_fit[labels[0]][k]["loaded"] == (load == "loaded"))
            ]
            if chosen:
                cells = [_cell([by_fit[label][k]["error"] for k in chosen]) for label in labels]
                lines.append(f"| {load} | {metric} | {' | '.join(cells)} |")
    lines += ["", "## Loaded held-out runs, normalized latency (simulated / real - 1)", "",
              "| engine | seed | rate req/s | real s/token | " + " | ".join(labels) + " |",
              "|---|---:|---:|---:|" + "---:|" * len(labels)]  # fmt: skip
    loaded = [k for k in keys if k[1] == "normalized_latency_s" and by_fit[labels[0]][k]["loaded"]]
    for key in sorted(loaded, key=lambda k: _where(k[0])):
        engine, seed, rate = _where(key[0])
        errors = [_percent(by_fit[label][key]["error"], "+") for label in labels]
        real = by_fit[labels[0]][key]["real"]
        lines.append(f"| {engine} | {seed} | {rate:.4g} | {real:.4f} | {' | '.join(errors)} |")
    by_engine = files[labels[1]]
    fits = {"both engines": by_engine, **{e: by_engine["engines"][e] for e in ENGINES}}
    lines += ["", "## Constants", "",
              "| fit | runs | step rows | fixed ms | us / decode row | ns / context token "
              "| us / prefill token | ms more / prefill | ms more / decode segment | median row error |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for label, fit in fits.items():
        lines.append(
            f"| {label} | {len(fit['runs'])} | {fit['rows']} | {1e3 * fit['fixed_s']:.3f} | "
            f"{1e6 * fit['per_token_s']:.2f} | {1e9 * fit['per_kv_token_s']:.1f} | "
            f"{1e6 * fit['per_prefill_token_s']:.2f} | {1e3 * fit['per_prefill_s']:.3f} | "
            f"{1e3 * fit['per_segment_s']:.3f} | {_percent(fit['median_relative_error'])} |"
        )
    lines += [
        "",
        "## Why: the fitting runs' decode steps at the same batch",
        "",
        *_step_table(by_engine["runs"]),
        "",
        "## Each run's steps priced by its engine's fit, over their measured time",
        "",
        "Summed over every step row of the run (seed 0 fitted, seeds 1 and 2 held out): below 1, the "
        "fit prices the run's steps faster than they ran, and its simulation serves faster.",
        "",
        *_priced_table(by_engine),
        "",
        "## Held out at each run's own step price",
        "",
        "Each loaded held-out run simulated again with its engine's fit scaled to price the run's "
        "steps at their measured total (errors simulated over real, less 1): what the simulation "
        "misses once the steps' price is the run's own.",
        "",
        *_own_price_table(by_engine),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    write_text(HERE / "comparison.md", render())
    print(f"wrote {HERE / 'comparison.md'}")
