"""Fitting the step-time cost model to measured runs, so simulation can sweep what a GPU did.

A real run's steps.csv says, for every row (a prefill step or a decode segment of k steps),
how long it took and what it did: steps, tokens fed, K/V positions attended, blocks swapped,
vmm driver pages mapped and unmapped. The cost model is linear in exactly those counts,

    duration = fixed_s * steps + per_token_s * decode tokens + per_kv_token_s * K/V read
               + per_swap_block_s * swaps + per_prefill_s * [row is a prefill]
               + per_prefill_token_s * prefill tokens
               + per_map_page_s * mapped pages + per_unmap_page_s * unmapped pages
               + per_segment_s * [row is a decode segment]

(K/V read: `kv_tokens_read`, the slots of K/V that attention reads: `context_tokens` where every
layer reads its whole context, less where sliding-window layers read only their window; the
count the simulator prices, `kvbench.cost_model.KvReads`), so its constants are a least-squares
fit over the rows, non-negative (a negative cost would be an artefact of collinear rows). With
at most 10 unknowns (the 9 above and a knee, below) the non-negative fit is exact by
enumeration: the best unconstrained fit over every subset of the terms whose counts are not all
zero, keeping the feasible one.

What is minimised (`objective`, `OBJECTIVES`) decides which duration of a row's shape the
constants price, and a simulation adds rows up (a makespan, a latency), so it needs the MEAN:

- "mean" (the default): each step's error relative to the step's predicted mean. A decode row
  of k steps is k observations of its per-step mean, so a row is scaled by prediction / sqrt(k);
  the prediction is the previous round's (a "relative" fit first, then `MEAN_ROUNDS` rounds,
  each with the knee search). Scaling by the model's prediction, never by the measured
  duration, makes the fit's equations balance under-priced and over-priced rows of one shape
  equally: the fit is unbiased for a step's mean whatever the noise's skew, and a 2 ms decode
  step still counts as much as a 200 ms prefill.
- "relative": every row scaled by 1 / its measured duration, as files fitted before the
  default changed. A slow draw then counts less than a fast one of the same shape, so the fit
  prices below the median (for log-normal noise of spread s, exp(-2 s^2) x the mean), and a
  simulation of runs with many noisy short rows is too fast: on the H200's OPT-13B runs it
  priced prefill rows at 0.84 x their measured total (0.76 x those under 64 tokens), and held
  out Alpaca runs' normalized latency came out 21-26 % low on orca-pow2 and paged.
- "absolute": squared error per step in seconds (a row scaled by 1 / sqrt(k)). Also unbiased
  for the mean, but long rows (prefills, long segments) take the weight, and the short rows
  that a loaded run has most of fit worse.

Held out (results/reference/calibration-objective: fitted on Figure 2's and 13's seed-0 runs,
checked on ten seed-1 runs), normalized latency is within 10 % on 9 of 10 loaded runs under
"mean" (largest error 10.5 %), 8 under "relative" (25.9 %) and "absolute" (18.3 %); mean TTFT
on 8, 7 and 7 (24.7, 46.8, 36.3 %); throughput on 10 of 10 under each (largest 2.7, 5.9, 4.1 %).

The prefill term is there because a real runner replays decode steps as CUDA graphs but runs
prefills eagerly: on the H200 an OPT-1.3B prefill pays milliseconds of kernel launches that a
graphed decode step does not, and without the term the fit underestimated prefill rows by
half (and every queueing delay with them).

Tokens are priced apart in prefill and decode rows for a like reason: one token cost fitted
to both was a compromise (2.9 us on the H200's OPT-1.3B runs) between prompt tokens in large
GEMMs (2.8 us) and decode rows (11.5 us, sampling and small GEMMs included), so runs with
larger decode batches than the fitting runs' (Alpaca's) were simulated too fast: rows of the
held-out Alpaca runs erred by 14.6 % (median) with one token cost, 5.6 % with two.

A decode step is not linear in its batch on a GPU: below some batch it is bound by reading the
weights, above it by compute (OPT-13B on the H200: 0.08 ms per row up to 32 rows, 0.10 beyond).
When the decode rows span enough batch sizes (two or more on each side of a candidate), the
fit also tries a knee: `per_row_above_knee_s` more per row beyond `knee_batch` rows, at each
observed batch size, and keeps the best only if it cuts the linear fit's squared relative
error by at least a tenth (`knee_gain` 0.9, `--knee-gain`); otherwise the linear model stands.
Why a tenth, not half (the rule of files written before `knee_gain` was recorded): the
replayed OPT-13B Alpaca runs of paged and orca-oracle (1 to 256 rows a step) need the knee at
104 rows, which cuts their error to 0.81 of the line's; kept, one fit of both engines puts 17
of 18 loaded held-out runs within 10 % on normalized latency (the line: 14) and prices the
decode steps of three engines it never saw within 2 % (the line: 6-7 % low at a few rows a
step). On every other committed fit (eager OPT-13B, OPT-1.3B, OPT-125M, vmm, Gemma 3's chunked
runs) no knee cuts the error by a tenth, and the fit is the line's
(results/reference/calibration-knee-gain).

A decode row is one call of the runner, and a real runner pays host work once per call (the
batch's inputs, block tables, the launch, the sync at the segment's end): `per_segment_s`.
Without it the fit spread that cost over `fixed_s`, which is right for the fitting runs' long
segments (ShareGPT at 6 req/s: 10-50 steps a row) and too cheap for runs whose arrivals cut
segments every step or two (Alpaca at Figure 13's rates): on the H200's OPT-13B runs decode
rows of one step were 0.45-1.7 ms slower than the fit, rows of 16 or more 0.1-0.2 ms a step
faster.

A real runner on a GPU replays each decode step from a CUDA graph of a bucket of rows (1, 2, 4,
then multiples of 8), so a batch of 9 runs 16 rows. A run whose summary says it replayed graphs
(`cuda_graphs`) counts a decode row's tokens and its knee's rows as the rows its steps ran
(`kvbench.cost_model.graph_rows`), and the fitted model prices them so (`pads_decode`). Counted
as the batch, Figure 2's OPT-13B runs on the H200 (1-36 rows, many padded by half or more) priced
a decode row at 24.9 us where the rows that ran cost 15.2, and the held-out Alpaca cells'
decode steps of 80-130 rows (orca-oracle, orca-pow2) 10-11 % above their measured time (5 %
with the rows counted as they ran, as at 1-7 rows: those cells ran faster than the fitting
runs at every batch size); their queueing near the knee, which a few per cent of step time
moves by half, came out up to three times the real one
(results/reference/calibration-opt13b/orca-queueing.md). Runs with and without graphs are not
fitted together: their decode rows cost differently.

Terms no row can measure are *assumed*: no run swapped (the swap cost), copied inside the arena
(steps.csv does not count copies), mapped or unmapped pages (the vmm driver costs) or
prefilled. Their values are written as used (the roofline's or the H200's driver measurement)
and named in `assumed`, with where each comes from in `assumed_from`, so no constant of a
fitted file is a silent default.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from kvbench.cost_model import CostModel, graph_rows
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import MAX_STEP_COST_S
from kvbench.results.files import read_json
from kvbench.results.packed import table_path
from kvbench.results.shape import STEP_TEXT, check_summary

TERMS = ("num_steps", "num_tokens", "context_tokens", "swapped_blocks")  # steps.csv columns
PREFILL = "prefill"  # steps.csv `kind` of a prefill row: the fifth term counts them, the sixth
# its tokens (taken out of the second term, which then counts decode rows alone)
MIXED = "mixed"  # steps.csv `kind` of a chunked-prefill step: fitted as a prefill row
MAPS = ("mapped_pages", "unmapped_pages")  # optional steps.csv columns: vmm driver pages per row
# optional steps.csv column: slots of K/V read (context_tokens less what window layers skip);
# the K/V term's count where present, else context_tokens (the same count without window layers)
READS = "kv_tokens_read"
# optional steps.csv column: a prefill or mixed row's query-key pairs (`KvReads.pairs`); runs
# written before it have none, and the fit then leaves `per_attention_pair_s` at 0
PAIRS = "attention_pairs"
# the CostModel field each count column prices, in column order (the knee's column last)
FITTED = ("fixed_s", "per_token_s", "per_kv_token_s", "per_swap_block_s", "per_prefill_s",
          "per_prefill_token_s", "per_map_page_s", "per_unmap_page_s", "per_segment_s",
          "per_attention_pair_s")  # fmt: skip
# terms added after files were written: left out of a file's digest while absent or 0, so a file
# that does not use one keeps the digest it had (and the runs priced with it stay current)
UNPRICED_WHEN_ZERO = (
    "per_segment_s", "pads_decode", "per_attention_pair_s", "routed_experts_s", "expert_pick"
)  # fmt: skip
# a knee is kept when its squared (scaled) error is at most this share of the linear fit's (the
# module docstring says why a tenth); `kvbench calibrate --knee-gain` sets another
KNEE_GAIN = 0.9
# the rule of cost files that record no `knee_gain` (written before it was recorded): a knee
# had to halve the line's error
EARLIER_KNEE_GAIN = 0.5
KNEE_SIDES = 2  # batch sizes a knee needs on each side
KNEE_CANDIDATES = 32  # knees tried at most (evenly spaced among the sizes seen): each is a full fit
# what the fit minimises (module docstring): "mean" (the default) prices a row's mean duration,
# "relative" (the median-tracking fit of earlier files), "absolute" (per-step squared error)
OBJECTIVES = ("mean", "relative", "absolute")
DEFAULT_OBJECTIVE = "mean"
MEAN_ROUNDS = 3  # reweighting rounds of the "mean" objective after its relative-error start
MEAN_FLOOR = 0.1  # a row's scale in those rounds: its prediction, at least this share of its duration


@dataclass(frozen=True)
class Calibration:
    cost: CostModel
    model: str
    runs: tuple[str, ...]
    rows: int
    median_relative_error: float  # of the fitted row durations, on the fitting rows
    p90_relative_error: float
    assumed_from: dict = field(default_factory=dict)  # per assumed term: where its value comes from
    # `by_engine`: each engine's own fit, on its runs alone (its simulations price with it); the
    # constants above, fitted on every run, price any other engine
    engines: dict[str, Calibration] = field(default_factory=dict)
    knee_gain: float = KNEE_GAIN  # the rule that kept or dropped a knee (always written)

    def to_dict(self) -> dict:
        own = {**asdict(self.cost), "assumed": list(self.cost.assumed), "assumed_from": self.assumed_from,
               "model": self.model, "runs": list(self.runs), "rows": self.rows,
               "median_relative_error": self.median_relative_error,
               "p90_relative_error": self.p90_relative_error}  # fmt: skip
        own["knee_gain"] = self.knee_gain  # a file without it was fitted under EARLIER_KNEE_GAIN
        if self.engines:
            own["engines"] = {name: fit.to_dict() for name, fit in sorted(self.engines.items())}
        return own


def shape_lines(calibration: Calibration) -> list[str]:
    """What a fit's constants do not say by themselves: its per-segment cost and decode knee,
    and each assumed term with its value and where it comes from (printed by `kvbench calibrate`)."""
    c = calibration.cost
    lines = []
    if c.pads_decode:
        lines.append("decode rows: as the CUDA graph's bucket a batch pads to (1, 2, 4, then multiples of 8)")
    if c.per_segment_s:
        lines.append(f"decode segment: {1e3 * c.per_segment_s:.3f} ms more per runner call (a decode row)")
    if c.per_attention_pair_s:
        lines.append(f"prefill attention: {1e9 * c.per_attention_pair_s:.3f} ns a query-key pair")
    if c.knee_batch is not None:
        extra = f"{1e6 * c.per_row_above_knee_s:.3f} us"
        lines.append(f"decode knee: {extra} more per row past {c.knee_batch} rows")
    else:  # the rule that dropped it, so a reader knows how close the fit came to keeping one
        cut = f"{100 * (1 - calibration.knee_gain):.0f} %"
        lines.append(f"decode: linear in its rows (no knee cut the line's error by {cut}: --knee-gain "
                     f"{calibration.knee_gain:g})")  # fmt: skip
    for name in c.assumed:
        value = getattr(c, name)
        shown = "a decode row's" if value is None else f"{value:.4g} s"
        source = calibration.assumed_from.get(name, "?")
        lines.append(f"assumed, no run measured it: {name} = {shown} ({source})")
    return lines


@dataclass(frozen=True)
class Rows:
    """A run's steps.csv as the fit reads it."""

    model: str
    counts: np.ndarray  # [R, 10] one column per `FITTED` term
    durations: np.ndarray  # [R]
    batch: np.ndarray  # [R] rows of each step (0 for prefill rows: no knee there)
    config: dict  # the run's config.json (block size and GPU for assumed terms)
    # decode steps replayed CUDA graphs (the summary's `cuda_graphs`): `counts`' decode tokens and
    # `batch` are the rows the graphs ran (`graph_rows`), not the batch
    padded: bool = False
    engine: str = "?"  # the engine that ran it (summary.json), for a fit by engine


def replays_prefills(config: dict) -> bool:
    """Whether a run (its config.json) replayed short prefills as CUDA graphs (`--prefill-graphs`).

    Why it matters: an eager short prefill on a GPU is the host launching each operator, a graph
    replay is its device work; on OPT-13B's Alpaca steps 13-25 ms against 9 ms
    (results/reference/alpaca-prefill-profile), so one prefill price for both is neither's."""
    return bool(config.get("prefill_graphs", False))


def read_rows(run: Path, *, simulated_ok: bool = False) -> Rows:
    """The counts and durations of a real run folder's steps.csv.

    A simulated run is refused (unless `simulated_ok`, for tests that recover a known model):
    its step times come from a cost model, so a fit to them returns that model with 0 % error
    and says nothing about a GPU. Every count and duration must be a finite number >= 0.
    """
    steps, summary = run / "steps.csv", run / "summary.json"
    if table_path(steps) is None or not summary.is_file():
        raise KvbenchError(f"{run}: not a kvbench run folder (no steps.csv and summary.json)")
    facts = check_summary(summary, read_json(summary))
    if facts.get("external"):
        engine = facts.get("engine")
        raise KvbenchError(f"{run}: a run of the external engine {engine}: its steps are not kvbench's")
    if facts.get("mode") != "real" and not simulated_ok:
        raise KvbenchError(
            f"{run}: a {facts.get('mode') or 'simulated'} run: its step times are a cost model's, and a fit "
            "to them would return that model; fit real runs (kvbench run)"
        )
    from kvbench.results.checks import check_step_kinds  # pandas, only where steps are read: not on a
    from kvbench.results.load import read_csv  # simulation's path

    table = read_csv(steps, text=STEP_TEXT)
    missing = [name for name in (*TERMS, "kind", "duration_s") if name not in table]
    if missing:
        raise KvbenchError(f"{steps}: no column {missing[0]!r} (written by an older kvbench?)")
    check_step_kinds(table_path(steps), table)
    optional = [name for name in (*MAPS, READS, PAIRS, "batch_size") if name in table]
    model = facts.get("model", "?")
    if READS not in table and _has_windows(model):
        raise KvbenchError(
            f"{steps}: no column {READS!r} (written by an older kvbench?), and {model}'s sliding-window "
            "layers read less K/V than its context_tokens counts; rerun it with this kvbench"
        )
    names = (*TERMS, *optional, "duration_s")
    data = table[list(names)].to_numpy(dtype=np.float64).reshape(-1, len(names))  # [R, N]
    bad = ~(np.isfinite(data) & (data >= 0))  # [R, N]
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise KvbenchError(
            f"{steps}: line {row + 2}, column {names[col]!r}: {data[row, col]} is not a finite number >= 0"
        )
    column = dict(zip(names, data.T, strict=True))  # name -> [R]
    zeros = np.zeros(len(data))
    # [R] 1 for a prefill row; a chunked-prefill mixed row is priced as one (kvbench.cost_model)
    prefill = np.isin(table["kind"].astype(str).to_numpy(), (PREFILL, MIXED)).astype(np.float64)
    tokens = column["num_tokens"]
    padded = bool(facts.get("cuda_graphs")) and "batch_size" in column
    if padded:  # a decode row's tokens are its batch x its steps; the graphs ran their bucket's rows
        rows = np.array([graph_rows(int(b)) for b in column["batch_size"]], dtype=np.float64)  # [R]
        tokens = np.where(prefill > 0, tokens, rows * column["num_steps"])
    counts = np.column_stack([
        column["num_steps"], tokens * (1 - prefill), column.get(READS, column["context_tokens"]),
        column["swapped_blocks"],
        prefill, tokens * prefill, *(column.get(m, zeros) for m in MAPS), 1 - prefill,
        column.get(PAIRS, zeros) * prefill,
    ])  # fmt: skip
    batch = (rows if padded else column.get("batch_size", zeros)) * (1 - prefill)
    config = read_json(run / "config.json") if (run / "config.json").is_file() else {}
    return Rows(model, counts, data[:, -1], batch, config, padded, str(facts.get("engine", "?")))


def _has_windows(model: str) -> bool:
    """Whether `model` (a preset or a config.json folder) has sliding-window layers; False for a
    name kvbench cannot size (its steps are then taken as written)."""
    from kvbench.models import get_model

    try:
        return bool(get_model(model).window_layers)
    except (KvbenchError, TypeError, ValueError):
        return False


def _nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of `a` `[R, T]` @ x ~ `b` by enumeration: the best
    unconstrained fit over every subset of the columns that are not all zero, keeping the
    feasible one; (x, squared error)."""
    best, best_loss = np.zeros(a.shape[1]), float((b**2).sum())  # all-zero fit
    active = [t for t in range(a.shape[1]) if a[:, t].any()]
    for size in range(1, len(active) + 1):
        for cols in map(list, itertools.combinations(active, size)):
            solution, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (solution < 0).any():
                continue
            loss = float(((a[:, cols] @ solution - b) ** 2).sum())
            if loss < best_loss - 1e-15:
                best, best_loss = np.zeros(a.shape[1]), loss
                best[cols] = solution
    return best, best_loss


def fit(counts: np.ndarray, durations: np.ndarray, objective: str = DEFAULT_OBJECTIVE) -> np.ndarray:
    """Non-negative least squares of the `objective` (`OBJECTIVES`), linear (no knee):
    constants `[T]` with counts `[R, T]` @ c ~ durations."""
    return fit_shape(counts, durations, np.zeros(len(durations)), objective)[0][:-1]


def _floor(predicted: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """A fit's predicted durations as the next round's row scale, kept above a tenth of each
    measured one (a row priced near 0 would otherwise take all the weight)."""
    return np.maximum(predicted, MEAN_FLOOR * durations)


def knee_column(steps: np.ndarray, batch: np.ndarray, knee: int) -> np.ndarray:
    """Rows past the knee, over a row's steps: what `per_row_above_knee_s` prices (`[R]`)."""
    return steps * np.maximum(batch - knee, 0)


def fit_shape(
    counts: np.ndarray, durations: np.ndarray, batch: np.ndarray, objective: str = DEFAULT_OBJECTIVE,
    knee_gain: float = KNEE_GAIN,
) -> tuple[np.ndarray, int | None]:  # fmt: skip
    """The fit's constants `[T]` and their knee term appended (`[T + 1]`), with the knee batch
    (None: linear), under `objective` (`OBJECTIVES`, module docstring). "mean" refits with each
    row scaled by the previous round's prediction over the square root of its steps instead of
    its measured duration (`MEAN_ROUNDS` rounds after a "relative" one), knee search included
    in every round."""
    if objective not in OBJECTIVES:
        raise KvbenchError(f"calibration objective {objective!r}: not one of {', '.join(OBJECTIVES)}")
    keep = durations > 0
    c, d, b = counts[keep], durations[keep], batch[keep]
    scale = np.sqrt(c[:, 0]) if objective == "absolute" else d
    constants, knee = _fit_scaled(c, d, b, scale, knee_gain)
    for _ in range(MEAN_ROUNDS if objective == "mean" else 0):  # a step's error relative to its mean
        scale = _floor(predict(c, b, constants, knee), d) / np.sqrt(c[:, 0])
        constants, knee = _fit_scaled(c, d, b, scale, knee_gain)
    return constants, knee


def predict(counts: np.ndarray, batch: np.ndarray, constants: np.ndarray, knee: int | None) -> np.ndarray:
    """Row durations `[R]` that `fit_shape`'s constants (knee term last) price."""
    hinge = knee_column(counts[:, 0], batch, knee) * constants[-1] if knee else 0.0
    return counts @ constants[:-1] + hinge


def priced(rows: Rows, section: dict) -> np.ndarray:
    """Each of a run's rows `[R]` as a cost file's section prices it: its top level (the fit of
    every run) or one engine's fit under `engines`. Summed, what a simulation of the same steps
    spends, so a page can say how much of a held-out run's error is its steps' price: a run
    whose steps cost 2 % more than its engine's fitting runs' (seeds of one panel differ by that
    much on the H200) is 2 % short of service, and near capacity its queue multiplies that."""
    if bool(section.get("pads_decode")) != rows.padded:  # its decode tokens count other rows
        run, fit = ("replayed", "did not") if rows.padded else ("did not replay", "did")
        raise KvbenchError(f"a run that {run} CUDA graphs priced by a fit of runs that {fit}: fit them apart")
    values = {name: section.get(name) or 0.0 for name in (*FITTED, "per_row_above_knee_s")}
    if section.get("per_prefill_token_s") is None:  # no prefill row fitted: a decode row's price
        values["per_prefill_token_s"] = values["per_token_s"]
    constants = np.array([values[name] for name in (*FITTED, "per_row_above_knee_s")])  # [T + 1]
    return predict(rows.counts, rows.batch, constants, section.get("knee_batch"))


def priced_over_measured(rows: Rows, section: dict) -> dict[str, float]:
    """A run's rows as `section` prices them over their measured time, summed: every row
    ("all"), its decode rows and its prefill rows (NaN where it has none). Below 1 the section
    prices the run faster than it ran, and a simulation of it serves faster."""
    cost = priced(rows, section)  # [R]
    prefill = rows.counts[:, 4] > 0  # [R] the prefill-row column
    ratios = {}
    for kind, chosen in (("all", np.ones_like(prefill)), ("decode", ~prefill), ("prefill", prefill)):
        measured = rows.durations[chosen].sum()
        ratios[kind] = float(cost[chosen].sum() / measured) if chosen.any() else math.nan
    return ratios


def _fit_scaled(
    counts: np.ndarray, durations: np.ndarray, batch: np.ndarray, scale: np.ndarray,
    knee_gain: float = KNEE_GAIN,
) -> tuple[np.ndarray, int | None]:  # fmt: skip
    """One non-negative fit of every row divided by its `scale` `[R]` (> 0), linear and with
    a knee at every decode batch size with `KNEE_SIDES` sizes on each side; the knee is kept
    if the best one's scaled squared error is at most `knee_gain` x the linear fit's."""
    a, target, steps = counts / scale[:, None], durations / scale, counts[:, 0]
    linear, linear_loss = _nnls(a, target)
    sizes = np.unique(batch[batch > 0])  # decode batch sizes seen
    best: tuple[float, np.ndarray, int] | None = None
    candidates = sizes[KNEE_SIDES - 1 : len(sizes) - KNEE_SIDES]
    if len(candidates) > KNEE_CANDIDATES:
        candidates = candidates[np.linspace(0, len(candidates) - 1, KNEE_CANDIDATES).round().astype(int)]
    for knee in candidates:
        hinge = knee_column(steps, batch, int(knee)) / scale
        solution, loss = _nnls(np.column_stack([a, hinge]), target)
        if solution[-1] > 0 and (best is None or loss < best[0]):
            best = (loss, solution, int(knee))
    if best is not None and best[0] <= knee_gain * linear_loss:
        return best[1], best[2]
    return np.append(linear, 0.0), None


def calibrate(
    runs: list[Path], *, simulated_ok: bool = False, objective: str = DEFAULT_OBJECTIVE,
    by_engine: bool = False, knee_gain: float = KNEE_GAIN,
) -> Calibration:  # fmt: skip
    """Fit the cost model to real runs' step rows under `objective` (`OBJECTIVES`;
    `simulated_ok`: see `read_rows`); with `by_engine`, also each engine's runs alone
    (`Calibration.engines`, `fit_rows`); `knee_gain`: see `KNEE_GAIN`."""
    if not runs:
        raise KvbenchError("kvbench calibrate: give at least one run folder")
    read = [read_rows(Path(run), simulated_ok=simulated_ok) for run in runs]
    models = {rows.model for rows in read}
    if len(models) > 1:
        names = ", ".join(sorted(models))
        raise KvbenchError(f"kvbench calibrate: the runs are of different models ({names})")
    # runs of two kinds whose steps cost differently: one fit over both would be a price of neither
    for kind, said in (
        (lambda rows: replays_prefills(rows.config),
         "replayed its short prefills as CUDA graphs (--prefill-graphs) and {} ran them eagerly; their "
         "prefill steps"),
        (lambda rows: rows.padded, "replayed CUDA graphs and {} did not; their decode steps"),
    ):  # fmt: skip
        kinds = [kind(rows) for rows in read]
        if len(set(kinds)) > 1:
            graphed, eager = runs[kinds.index(True)], runs[kinds.index(False)]
            said = said.format(eager)
            raise KvbenchError(f"kvbench calibrate: {graphed} {said} cost differently, fit them apart")
    pooled = fit_rows(read, [str(r) for r in runs], objective, knee_gain)
    if not by_engine:
        return pooled
    own = {}
    for engine in sorted({rows.engine for rows in read}):
        mine = [i for i, rows in enumerate(read) if rows.engine == engine]
        try:
            names = [str(runs[i]) for i in mine]
            own[engine] = fit_rows([read[i] for i in mine], names, objective, knee_gain)
        except KvbenchError as error:  # which engine's runs are too few: the pooled fit had enough
            raise KvbenchError(
                f"{error} (--by-engine: the runs of {engine}, {runs[mine[0]]} first)"
            ) from None
    return replace(pooled, engines=own)


def fit_rows(
    read: list[Rows], runs: list[str], objective: str = DEFAULT_OBJECTIVE, knee_gain: float = KNEE_GAIN
) -> Calibration:
    """One fit of the rows of `read` (runs of one model and one kind, named `runs`).

    Fitted by engine (`calibrate(by_engine=True)`) because engines that decode the same batch
    do not cost the same on a GPU: paged attention reads K/V through a block table kept on the
    device, a contiguous engine does not. OPT-13B on the H200 with replayed prefills
    (results/reference/calibration-by-engine): paged's median decode step is 1-4 % longer than
    orca-oracle's at each batch from 1 to 127 rows, so one fit of both priced orca-oracle's
    decode rows 2.5 % high (3.6 % past 64 rows) and paged's 3-4 % low, which moved orca-oracle's
    simulated capacity by 3 % and its normalized latency past capacity by half."""
    c = np.concatenate([rows.counts for rows in read])
    d = np.concatenate([rows.durations for rows in read])
    batch = np.concatenate([rows.batch for rows in read])
    measured = int(c.any(axis=0).sum())  # constants some row measures; the others are assumed
    if len(d) < measured:
        raise KvbenchError(f"kvbench calibrate: {len(d)} step rows are too few to fit {measured} constants")
    constants, knee = fit_shape(c, d, batch, objective, knee_gain)
    predicted = predict(c, batch, constants, knee)
    error = np.abs(predicted - d) / np.maximum(d, 1e-12)
    model = read[0].model
    fitted = dict(zip(FITTED, map(float, constants), strict=False))
    if fitted["per_prefill_token_s"] == 0 and not c[:, 5].any():
        fitted["per_prefill_token_s"] = None  # no prefill row: prompt tokens cost a decode row's
    knee_cost = float(constants[-1])
    cost = CostModel(**fitted, per_row_above_knee_s=knee_cost, knee_batch=knee, pads_decode=read[0].padded)
    cost, sources = _assume(cost, c, model, read[0].config)
    return Calibration(
        cost, model, tuple(runs), len(d), float(np.median(error)), float(np.quantile(error, 0.9)), sources,
        knee_gain=knee_gain,
    )  # fmt: skip


def _assume(cost: CostModel, counts: np.ndarray, model: str, config: dict) -> tuple[CostModel, dict]:
    """`cost` with every term no row measured set to its default and named in `assumed`, and
    where each default comes from: the roofline of the model (on the runs' `emulate_gpu`, at
    their block size) for swaps and arena copies, the H200 driver measurement for page maps."""
    from kvbench.budget import get_gpu
    from kvbench.cost_model import DEFAULT_SOURCES, MAP_PAGE_S, UNMAP_PAGE_S
    from kvbench.models import get_model

    unmeasured = [name for column, name in enumerate(FITTED) if not counts[:, column].any()]
    unmeasured.append("per_copy_slot_s")  # steps.csv has no copy count: never measured
    values = {"per_map_page_s": MAP_PAGE_S, "per_unmap_page_s": UNMAP_PAGE_S,
              "per_prefill_s": 0.0, "per_prefill_token_s": None}  # fmt: skip
    sources = dict(DEFAULT_SOURCES)
    try:
        gpu, block_size = config.get("emulate_gpu", "a100-40gb"), int(config.get("block_size", 16))
        roofline = CostModel.roofline(get_model(model), get_gpu(gpu), block_size)
        values |= {"per_swap_block_s": roofline.per_swap_block_s, "per_copy_slot_s": roofline.per_copy_slot_s}
        sources["per_swap_block_s"] += f" ({block_size}-slot blocks of {model})"
        sources["per_copy_slot_s"] += f" ({model} on the {gpu})"
    except (KvbenchError, TypeError, ValueError):  # a checkpoint folder's model: no preset roofline
        values |= {"per_swap_block_s": 0.0, "per_copy_slot_s": 0.0}
        sources["per_swap_block_s"] = sources["per_copy_slot_s"] = "none: 0 (no preset roofline of the model)"
    unmeasured = [name for name in unmeasured if name in values]
    assumed = {name: values[name] for name in unmeasured}
    return replace(cost, **assumed, assumed=tuple(unmeasured)), {name: sources[name] for name in unmeasured}


def cost_file_digest(path: str) -> str | None:
    """SHA-256 of what a cost-model file prices with (its model and constants; None if
    unreadable): runs record it, so a resumed sweep reruns cells whose file was refitted in
    place rather than keep their old constants. Held-out errors written into the file beside
    the fit do not count: a refit with the same constants leaves the runs current."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    terms = _priced(data) | {"model": data.get("model")}
    engines = data.get("engines")
    if isinstance(engines, dict) and engines:  # fits by engine price their runs: a refit is a change
        terms["engines"] = {name: _priced(fit) if isinstance(fit, dict) else fit
                             for name, fit in engines.items()}  # fmt: skip
    return hashlib.sha256(json.dumps(terms, sort_keys=True).encode()).hexdigest()


def _priced(data: dict) -> dict:
    """What a fit's constants price with (its CostModel fields), a term added after files were
    written left out while absent or 0, so a file prices as it did."""
    priced = {key: data.get(key) for key in (f.name for f in fields(CostModel))}
    for key in UNPRICED_WHEN_ZERO:
        if not priced[key]:
            del priced[key]
    return priced


def read_cost_file(path: str, flag: str) -> dict:
    """The JSON object of a cost file given as `flag`; a folder, a missing file or one that
    does not parse is a one-line error saying which, naming the flag and the path."""
    where = f"{flag} {path}"
    if not str(path).strip():  # Path('') is the current folder
        raise KvbenchError(f"{flag}: an empty path names no file")
    if Path(path).is_dir():
        raise KvbenchError(f"{where}: is a folder, not a kvbench calibrate file")
    if not Path(path).is_file():
        raise KvbenchError(f"{where}: cannot read it (no such file)")
    try:
        return read_json(Path(path))
    except KvbenchError as error:
        raise KvbenchError(f"{where}: cannot read it ({error})") from None


def model_of(data: dict, where: str) -> str:
    """The model a cost file was fitted on. A file naming none is refused rather than applied to
    any model: its constants price one model's steps (`kvbench calibrate` always writes it)."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise KvbenchError(
            f'{where}: names no model (no "model" key, which kvbench calibrate writes): the constants '
            "price the steps of the model they were fitted on, so the file must say which"
        )
    return model


def engine_section(data: dict, engine: str | None, where: str) -> dict:
    """The constants of a cost file that price `engine`: its own fit (`engines`, written by
    `kvbench calibrate --by-engine`) where the file has one, else the file's fit of every run."""
    engines = data.get("engines")
    if engines is None or engine is None:
        return data
    if not isinstance(engines, dict) or not all(isinstance(fit, dict) for fit in engines.values()):
        shown = json.dumps(engines)[:80]
        raise KvbenchError(f"{where}: 'engines' must map engine names to fits, got {shown}")
    return engines.get(engine, data)


def load_cost_model(path: str, model: str, engine: str | None = None) -> CostModel:
    """The cost model of a `kvbench calibrate` file, checked against the run's model: every
    constant a number in [0, MAX_STEP_COST_S] (NaN, inf or a negative cost would give NaN or
    negative latencies that look like results, a huge one latencies that overflow to inf), the
    knee a whole batch >= 1 or null, `assumed` a list of cost terms. A file written before
    `assumed` existed assumed what it lacks or left at 0: the swap, copy and page-map costs. A
    file fitted by engine (`engines`) prices `engine` with its own fit where it has one, any
    other engine with the fit of every run."""
    where = f"--cost-model {path}"
    top = read_cost_file(path, "--cost-model")
    data = engine_section(top, engine, where)
    if data is not top:
        where = f"{where} (its fit of {engine})"
    fitted = top.get("model")
    if isinstance(fitted, str) and fitted and fitted != model:  # no name at all: `model_of` below
        raise KvbenchError(f"{where}: fitted on {fitted}, not on --model {model}")
    required = ("fixed_s", "per_token_s", "per_kv_token_s")
    optional = ("per_swap_block_s", "per_copy_slot_s", "per_prefill_s", "per_prefill_token_s",
                "per_map_page_s", "per_unmap_page_s", "per_row_above_knee_s", "per_segment_s",
                "per_attention_pair_s", "routed_experts_s")  # fmt: skip
    missing = [key for key in required if key not in data]
    if missing:
        raise KvbenchError(f"{where}: not a kvbench calibrate file (no {missing[0]!r})")
    model_of(top, where)  # a file naming no model is refused, not applied to this one
    values: dict = {}
    for key in (*required, *optional):
        value = data.get(key)
        if value is None and key not in required:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise KvbenchError(f"{where}: {key!r} must be a finite number >= 0, got {json.dumps(value)}")
        if value > MAX_STEP_COST_S:
            raise KvbenchError(f"{where}: {key!r} is {value:g} s, over a step's most ({MAX_STEP_COST_S:g} s)")
        values[key] = float(value)
    pick = data.get("expert_pick")  # a share, not a cost: absent in files fitted before it, and 0 in any fit
    if pick is not None:
        if isinstance(pick, bool) or not isinstance(pick, int | float) or not 0 <= pick <= 1:
            shown = json.dumps(pick)
            raise KvbenchError(f"{where}: 'expert_pick' is a share of routed experts, in [0, 1], got {shown}")
        values["expert_pick"] = float(pick)
    if values.get("routed_experts_s") and not pick:
        raise KvbenchError(f"{where}: 'routed_experts_s' needs an 'expert_pick' > 0 (the share a row reads)")
    knee = data.get("knee_batch")
    if knee is not None and (isinstance(knee, bool) or not isinstance(knee, int) or knee < 1):
        raise KvbenchError(f"{where}: 'knee_batch' must be a whole number >= 1 or null, got {knee}")
    pads = data.get("pads_decode", False)  # absent in files fitted before it existed: the batch
    if not isinstance(pads, bool):
        raise KvbenchError(f"{where}: 'pads_decode' must be true or false, got {json.dumps(pads)}")
    not_costs = ("knee_batch", "assumed", "pads_decode", "expert_pick")  # a batch, lists, a flag, a share
    terms = {f.name for f in fields(CostModel) if f.name not in not_costs}
    assumed = data.get("assumed")
    if assumed is None:  # an older file: what it could not fit is what it lacks or left at 0
        lacks = ("per_swap_block_s", "per_copy_slot_s", "per_map_page_s", "per_unmap_page_s")
        assumed = [key for key in lacks if not values.get(key)]
    elif not isinstance(assumed, list) or not all(str(name) in terms for name in assumed):
        raise KvbenchError(f"{where}: 'assumed' must be a list of cost terms ({', '.join(sorted(terms))}), "
                           f"got {json.dumps(assumed)}")  # fmt: skip
    return replace(CostModel(**values), knee_batch=knee, pads_decode=pads, assumed=tuple(assumed))
