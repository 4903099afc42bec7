"""Fitting the step-time cost model to measured runs, so simulation can sweep what a GPU did.

A real run's steps.csv says, for every row (a prefill step or a decode segment of k steps),
how long it took and what it did: steps, tokens fed, K/V positions attended, blocks swapped.
The cost model is linear in exactly those counts,

    duration = fixed_s * steps + per_token_s * decode tokens + per_kv_token_s * context
               + per_swap_block_s * swaps + per_prefill_s * [row is a prefill]
               + per_prefill_token_s * prefill tokens

so its constants are a least-squares fit over the rows: non-negative (a negative cost would be
an artefact of collinear rows), and weighted by 1 / duration so that a 2 ms decode step counts
as much as a 200 ms prefill (the fit minimises relative error, which is what a simulated
latency's error is judged by). With 6 unknowns the non-negative fit is exact by enumeration:
the best unconstrained fit over every subset of the terms, keeping the feasible one.

The prefill term is there because a real runner replays decode steps as CUDA graphs but runs
prefills eagerly: on the H200 an OPT-1.3B prefill pays milliseconds of kernel launches that a
graphed decode step does not, and without the term the fit underestimated prefill rows by
half (and every queueing delay with them).

Tokens are priced apart in prefill and decode rows for a like reason: one token cost fitted
to both was a compromise (2.9 us on the H200's OPT-1.3B runs) between prompt tokens in large
GEMMs (2.8 us) and decode rows (11.5 us, sampling and small GEMMs included), so runs with
larger decode batches than the fitting runs' (Alpaca's) were simulated too fast: rows of the
held-out Alpaca runs erred by 14.6 % (median) with one token cost, 5.6 % with two.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from kvbench.results.files import read_json
from kvbench.results.shape import STEP_TEXT, check_summary

TERMS = ("num_steps", "num_tokens", "context_tokens", "swapped_blocks")  # steps.csv columns
PREFILL = "prefill"  # steps.csv `kind` of a prefill row: the fifth term counts them, the sixth
# its tokens (taken out of the second term, which then counts decode rows alone)


@dataclass(frozen=True)
class Calibration:
    cost: CostModel
    model: str
    runs: tuple[str, ...]
    rows: int
    median_relative_error: float  # of the fitted row durations, on the fitting rows
    p90_relative_error: float

    def to_dict(self) -> dict:
        return {**asdict(self.cost), "model": self.model, "runs": list(self.runs), "rows": self.rows,
                "median_relative_error": self.median_relative_error,
                "p90_relative_error": self.p90_relative_error}  # fmt: skip


def read_rows(run: Path, *, simulated_ok: bool = False) -> tuple[str, np.ndarray, np.ndarray]:
    """(model, counts `[R, 6]`, durations `[R]`) of a real run folder's steps.csv.

    A simulated run is refused (unless `simulated_ok`, for tests that recover a known model):
    its step times come from a cost model, so a fit to them returns that model with 0 % error
    and says nothing about a GPU. Every count and duration must be a finite number >= 0.
    """
    steps, summary = run / "steps.csv", run / "summary.json"
    if not steps.is_file() or not summary.is_file():
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
    model = facts.get("model", "?")
    from kvbench.results.load import read_csv  # pandas, only where steps are read: not on a simulation's path

    table = read_csv(steps, text=STEP_TEXT)
    missing = [name for name in (*TERMS, "kind", "duration_s") if name not in table]
    if missing:
        raise KvbenchError(f"{steps}: no column {missing[0]!r} (written by an older kvbench?)")
    names = (*TERMS, "duration_s")
    data = table[list(names)].to_numpy(dtype=np.float64).reshape(-1, len(names))  # [R, 5]
    bad = ~(np.isfinite(data) & (data >= 0))  # [R, 5]
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise KvbenchError(
            f"{steps}: line {row + 2}, column {names[col]!r}: {data[row, col]} is not a finite number >= 0"
        )
    prefill = (table["kind"].astype(str).to_numpy() == PREFILL).astype(np.float64)  # [R] 1 for a prefill row
    counts = data[:, : len(TERMS)].copy()  # [R, 4]
    tokens = counts[:, 1].copy()  # [R]
    counts[:, 1] = tokens * (1 - prefill)  # decode rows' tokens
    return model, np.column_stack([counts, prefill, tokens * prefill]), data[:, -1]


def fit(counts: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """Non-negative, relative-error least squares: constants `[T]` with counts `[R, T]` @ c ~ durations."""
    keep = durations > 0
    a = counts[keep] / durations[keep, None]  # [R, T] each row scaled to relative error
    b = np.ones(int(keep.sum()))
    best, best_loss = np.zeros(counts.shape[1]), float(len(b))  # all-zero fit: loss = R
    for size in range(1, counts.shape[1] + 1):
        for subset in itertools.combinations(range(counts.shape[1]), size):
            cols = list(subset)
            if not a[:, cols].any():
                continue
            solution, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (solution < 0).any():
                continue
            loss = float(((a[:, cols] @ solution - b) ** 2).sum())
            if loss < best_loss - 1e-15:
                best, best_loss = np.zeros(counts.shape[1]), loss
                best[cols] = solution
    return best


def calibrate(runs: list[Path], *, simulated_ok: bool = False) -> Calibration:
    """Fit the cost model to real runs' step rows (`simulated_ok`: see `read_rows`)."""
    if not runs:
        raise KvbenchError("kvbench calibrate: give at least one run folder")
    models, counts, durations = set(), [], []
    for run in runs:
        model, c, d = read_rows(Path(run), simulated_ok=simulated_ok)
        models.add(model)
        counts.append(c)
        durations.append(d)
    if len(models) > 1:
        names = ", ".join(sorted(models))
        raise KvbenchError(f"kvbench calibrate: the runs are of different models ({names})")
    c, d = np.concatenate(counts), np.concatenate(durations)
    if len(d) < c.shape[1]:
        raise KvbenchError(f"kvbench calibrate: {len(d)} step rows are too few to fit {c.shape[1]} constants")
    constants = fit(c, d)
    error = np.abs(c @ constants - d) / np.maximum(d, 1e-12)
    return Calibration(
        _cost(*map(float, constants)), models.pop(), tuple(str(r) for r in runs), len(d),
        float(np.median(error)), float(np.quantile(error, 0.9)),
    )  # fmt: skip


def cost_file_digest(path: str) -> str | None:
    """SHA-256 of what a cost-model file prices with (its model and constants; None if
    unreadable): runs record it, so a resumed sweep reruns cells whose file was refitted in
    place rather than keep their old constants. Held-out errors written into the file beside
    the fit do not count: a refit with the same constants leaves the runs current."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    priced = {key: data.get(key) for key in ("model", *(f.name for f in fields(CostModel)))}
    return hashlib.sha256(json.dumps(priced, sort_keys=True).encode()).hexdigest()


def load_cost_model(path: str, model: str) -> CostModel:
    """The cost model of a `kvbench calibrate` file, checked against the run's model: every
    constant a finite number >= 0 (NaN, inf or a negative cost would give NaN or negative
    latencies that look like results)."""
    where = f"--cost-model {path}"
    if not Path(path).is_file():
        raise KvbenchError(f"{where}: cannot read it (no such file)")
    try:
        data = read_json(Path(path))
    except KvbenchError as error:
        raise KvbenchError(f"{where}: cannot read it ({error})") from None
    if data.get("model") not in (None, model):
        raise KvbenchError(f"{where}: fitted on {data['model']}, not on --model {model}")
    required = ("fixed_s", "per_token_s", "per_kv_token_s")
    optional = ("per_swap_block_s", "per_prefill_s", "per_prefill_token_s")
    missing = [key for key in required if key not in data]
    if missing:
        raise KvbenchError(f"{where}: not a kvbench calibrate file (no {missing[0]!r})")
    values = {}
    for key in (*required, *optional):
        value = data.get(key)
        if value is None and key not in required:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise KvbenchError(f"{where}: {key!r} must be a finite number >= 0, got {json.dumps(value)}")
        values[key] = float(value)
    return CostModel(
        values["fixed_s"], values["per_token_s"], values["per_kv_token_s"],
        values.get("per_swap_block_s", 0.0),
        per_prefill_s=values.get("per_prefill_s", 0.0),
        per_prefill_token_s=values.get("per_prefill_token_s"),  # files fitted before it: one token cost
    )  # fmt: skip


def _cost(
    fixed: float, token: float, context: float, swap: float, prefill: float, prefill_token: float
) -> CostModel:
    """The fitted constants, in TERMS order then the two prefill terms, as a cost model."""
    return CostModel(fixed, token, context, swap, per_prefill_s=prefill, per_prefill_token_s=prefill_token)
