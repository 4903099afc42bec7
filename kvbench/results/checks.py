"""What a run folder's files must hold to be read as the run kvbench wrote (kvbench.results.load).

`shape.check_summary` checks the type of every key a reader uses; these checks add what a file
edited by hand or cut short can still get wrong with every type right: a key kvbench always
writes that is missing (a report would print "?" for the engine), a count below zero or
`completed` above `num_requests` (a report would print "5/-1"), a NaN or Infinity where kvbench
writes a number, a time, rate or latency below 0, an occupancy share outside [0, 1] or shares
not summing to the arena, a steps.csv or requests.csv without its header, without one of its
columns, or without the rows summary.json counts. Each is refused with one line naming the file and the key,
column or line (`KvbenchError`).

The rules are kvbench's own writers' (`kvbench.simulate.execute`, `kvbench.metrics.summary`,
`kvbench.external.observed`, `kvbench.real.run`), as far as they hold for every folder kvbench
ever wrote: keys and columns added later (with a default) may be absent, and null or NaN are
accepted exactly where kvbench writes them:

- NaN: a latency distribution with no defined value (every key of it NaN: `<stat>_ttft_s`,
  `_e2el_s`, `_queueing_s`, `normalized_latency_s` and `goodput_fraction` when no request
  completed; `<stat>_tpot_s` and `_itl_s` also when every output was one token), and the keys of
  a real run's NVML and host collectors (`energy_j`, `energy_per_output_token_j`, `nvml_*`,
  `host_*`) where the counter could not be read. Infinity never.
- null: `mean_batched_requests_saturated` (a run that never saturated); in a run of an outside
  engine (`external: true`) also what it does not observe (`num_steps`, `num_slots`,
  `num_preemptions`, `preempted_requests`, `kv_budget_bytes`, `kv_budget_source`), and in its
  tables the columns it does not observe are empty.

Everything here is a look at keys, headers and whole columns, so a report over hundreds of runs
costs no more than reading them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import KvbenchError
from kvbench.results.shape import SUMMARY_SHARES

# ---- summary.json ---------------------------------------------------------------------------

SUMMARY_REQUIRED_TEXT = ("engine", "model", "trace", "trace_source", "mode", "kv_budget_source")
# counts: integers >= 0
SUMMARY_REQUIRED_COUNTS = ("num_requests", "completed", "num_steps", "num_preemptions",
                           "preempted_requests", "peak_batched_requests", "num_slots",
                           "kv_bytes_per_token", "kv_budget_bytes")  # fmt: skip
SUMMARY_OPTIONAL_COUNTS = ("prefix_hit_tokens", "good_requests", "dropped_requests",
                           "dropped_of", "dropped_longer_than", "arena_slots",
                           "tensor_parallel", "nvml_samples")  # fmt: skip
SUMMARY_REQUIRED_NUMBERS = ("makespan_s", "busy_s", "saturated_s", "request_throughput",
                            "output_token_throughput", "total_token_throughput",
                            "mean_batched_requests", "mean_batched_requests_saturated",
                            "normalized_latency_s")  # fmt: skip
SUMMARY_REQUIRED_OTHER = ("percentiles", "occupancy", "occupancy_saturated")
MAY_BE_NULL = ("mean_batched_requests_saturated",)
EXTERNAL_MAY_BE_NULL = ("num_steps", "num_slots", "num_preemptions", "preempted_requests",
                        "kv_budget_bytes", "kv_budget_source")  # fmt: skip

DISTRIBUTIONS = ("ttft_s", "tpot_s", "itl_s", "e2el_s", "queueing_s")  # kvbench.metrics.latency.distribution
ONE_TOKEN_UNDEFINED = ("tpot_s", "itl_s")  # no value where every output is one token
_STAT = re.compile(r"(?:mean|median|std|p[0-9]+(?:\.[0-9]+)?)_(" + "|".join(DISTRIBUTIONS) + ")")
NAN_WITHOUT_COMPLETED = ("normalized_latency_s", "goodput_fraction")
NAN_COLLECTED = ("energy_j", "energy_per_output_token_j")  # NVML without an energy counter
NAN_COLLECTED_PREFIXES = ("nvml_", "host_")
SHARE_SLACK = 1e-6  # float rounding in a share, and in their sum (kvbench writes free = 1 - the rest)


def _shown(value) -> str:
    return json.dumps(value)[:40]


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _not_finite(value, key: str) -> list[tuple[str, float]]:
    """(key, value) of every NaN or Infinity in `value`, nested objects and lists included."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(key, value)]
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _not_finite(v, f"{key}.{k}")]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in _not_finite(v, f"{key}[{i}]")]
    return []


def check_run_summary(path: Path, summary: dict) -> dict:
    """`summary` (summary.json at `path`, its types checked by `shape.check_summary`) if it holds
    every key kvbench writes with a value kvbench could have written, else a one-line error."""
    external = summary.get("external") is True
    nullable = MAY_BE_NULL + (EXTERNAL_MAY_BE_NULL if external else ())
    percentiles = summary.get("percentiles")
    stats = ["mean", "median", "std", *(f"p{q:g}" for q in percentiles or () if isinstance(q, int | float))]
    distribution_keys = [f"{stat}_{name}" for name in DISTRIBUTIONS for stat in stats]
    required = (
        *SUMMARY_REQUIRED_TEXT,
        *SUMMARY_REQUIRED_COUNTS,
        *SUMMARY_REQUIRED_NUMBERS,
        *SUMMARY_REQUIRED_OTHER,
        *distribution_keys,
    )
    for key in required:
        if key not in summary:
            raise KvbenchError(f"{path}: no {key!r}: every summary.json kvbench writes has it")
        if summary[key] is None and key not in nullable:
            raise KvbenchError(f"{path}: {key!r} is null: kvbench writes a value there")
    counts = [*SUMMARY_REQUIRED_COUNTS, *(k for k in SUMMARY_OPTIONAL_COUNTS if k in summary)]
    counts += [k for k in summary if k.startswith("num_") and k not in counts]
    for key in counts:
        value = summary[key]
        if not (_is_count(value) or (value is None and key in nullable)):
            raise KvbenchError(f"{path}: {key!r} must be a whole number >= 0, got {_shown(value)}")
    completed = summary["completed"]
    if completed > summary["num_requests"]:
        raise KvbenchError(
            f"{path}: 'completed' is {completed}, more than 'num_requests' ({summary['num_requests']})"
        )
    for key in ("preempted_requests", "good_requests"):
        if isinstance(summary.get(key), int) and summary[key] > completed:
            raise KvbenchError(f"{path}: {key!r} is {summary[key]}, more than 'completed' ({completed})")
    for where, number in (found for key, value in summary.items() for found in _not_finite(value, key)):
        if not _nan_written(summary, where, number):
            raise KvbenchError(f"{path}: {where!r} must be a finite number, got {_shown(number)}")
    for key in (*SUMMARY_REQUIRED_NUMBERS, *distribution_keys):  # times, rates, batch sizes
        if _number(summary[key]) and summary[key] < 0:
            raise KvbenchError(f"{path}: {key!r} must be >= 0, got {_shown(summary[key])}")
    for key in SUMMARY_SHARES:
        _check_shares(path, key, summary[key])
    return summary


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_shares(path: Path, key: str, shares) -> None:
    """An occupancy: each category a share of the arena in [0, 1], all of them summing to 1 (or
    every one 0: a run that never saturated), within float rounding (`SHARE_SLACK`)."""
    if not isinstance(shares, dict):
        return  # its type is shape.check_summary's
    values = {name: v for name, v in shares.items() if _number(v)}
    for name, value in values.items():
        if not -SHARE_SLACK <= value <= 1 + SHARE_SLACK:
            raise KvbenchError(
                f"{path}: '{key}.{name}' must be a share of the arena in [0, 1], got {_shown(value)}"
            )
    total = sum(values.values())
    if values and abs(total - 1) > SHARE_SLACK and any(values.values()):
        raise KvbenchError(f"{path}: {key!r} sums to {total:.6g}: its categories share the whole arena (1)")


def _nan_written(summary: dict, key: str, value: float) -> bool:
    """Whether kvbench writes NaN at `key` of `summary` (the module docstring says where)."""
    if not math.isnan(value):
        return False  # Infinity: never
    stat = _STAT.fullmatch(key)
    if stat:  # all of a distribution's keys, or none
        name = stat[1]
        keys = [k for k in summary if (m := _STAT.fullmatch(k)) and m[1] == name]
        whole = all(isinstance(summary[k], float) and math.isnan(summary[k]) for k in keys)
        return whole and (summary["completed"] == 0 or name in ONE_TOKEN_UNDEFINED)
    if key in NAN_WITHOUT_COMPLETED:
        return summary["completed"] == 0
    return key in NAN_COLLECTED or key.startswith(NAN_COLLECTED_PREFIXES)


# ---- steps.csv and requests.csv ---------------------------------------------------------------

# kvbench.engine.StepRecord's and kvbench.metrics.summary.RequestRecord's fields, less those a
# folder written before they existed lacks (added with a default, or listed here)
STEP_COLUMNS = ("step", "num_steps", "start_s", "duration_s", "kind", "batch_size",
                "num_tokens", "context_tokens", "swapped_blocks", "num_waiting", "num_running",
                "num_preempted", "num_swapped", "token_states", "reservation", "internal_frag",
                "allocator_overhead", "external_frag", "free")  # fmt: skip
STEP_COLUMNS_LATER = ("kv_tokens_read", "outside_window", "mapped_idle", "shared_saved",
                      "mapped_pages", "unmapped_pages", "attention_pairs")  # fmt: skip
STEP_NOT_COUNTS = ("start_s", "duration_s", "kind", "kv_tokens_read", "attention_pairs")
STEP_FINITE = ("start_s", "duration_s")
REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_len", "output_len", "admitted_s",
                   "first_token_s", "finish_s", "num_preemptions", "queueing_s", "ttft_s",
                   "tpot_s", "e2el_s", "normalized_latency_s", "max_itl_s")  # fmt: skip
REQUEST_COLUMNS_LATER = ("prefix_hit_tokens", "num_outputs")
REQUEST_COUNTS = ("request_id", "prompt_len", "output_len", "num_preemptions",
                  "prefix_hit_tokens", "num_outputs")  # fmt: skip
REQUEST_FINITE = ("arrival_s", "admitted_s", "first_token_s", "finish_s", "queueing_s",
                  "ttft_s", "e2el_s", "normalized_latency_s")  # fmt: skip


def _header(path: Path, frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    if not len(frame.columns):
        raise KvbenchError(f"{path}: empty (no header line): not a {what} kvbench wrote")
    missing = [name for name in columns if name not in frame]
    if missing:
        raise KvbenchError(f"{path}: no {missing[0]!r} column: not a {what} kvbench wrote")


def _line(path: Path, frame: pd.DataFrame, name: str, bad: np.ndarray, want: str) -> KvbenchError:
    row = int(np.flatnonzero(bad)[0])
    value = frame[name].iloc[row]
    cell = "an empty cell (or nan)" if value != value else repr(str(value))
    return KvbenchError(f"{path}: column {name!r}, line {row + 2}: {cell} is not {want}")


def _whole_numbers(path: Path, frame: pd.DataFrame, names, external: bool) -> None:
    """Count columns hold whole numbers (an outside engine's: or nothing, not observed).

    A column of whole numbers reads as integers (`load.read_csv`), so only the others are looked
    at: a table kvbench wrote has none but an outside engine's empty ones."""
    kinds = {name: dtype.kind for name, dtype in frame.dtypes.items()}
    for name in names:
        if kinds.get(name, "i") in "iu":
            continue
        values = frame[name].to_numpy(dtype=np.float64)
        if external and np.isnan(values).all():
            continue
        bad = ~np.isfinite(values) | (values != np.floor(values))
        if bad.any():
            raise _line(path, frame, name, bad, "a whole number")


def _finite(path: Path, frame: pd.DataFrame, names) -> None:
    """Columns `names` (where the table has them) hold finite numbers >= 0 (times from the run's
    start, durations, latencies): no empty cell, nan, inf or negative value."""
    kinds = {name: dtype.kind for name, dtype in frame.dtypes.items()}
    for name in names:
        if kinds.get(name) == "f":  # integers are finite
            bad = ~np.isfinite(frame[name].to_numpy())
            if bad.any():
                raise _line(path, frame, name, bad, "a finite number")
        if kinds.get(name, "O") in "iuf":
            bad = frame[name].to_numpy() < 0
            if bad.any():
                raise _line(path, frame, name, bad, "a number >= 0")


STEP_KINDS = ("prefill", "decode", "mixed")  # steps.csv's `kind` (engines.batch.Batch.kind)


def check_step_kinds(path: Path, frame: pd.DataFrame) -> None:
    """Every row's `kind` one of `STEP_KINDS`: a row of another kind would be read as a decode
    row by `kvbench calibrate` and priced, and fitted, as one."""
    bad = ~frame["kind"].astype(str).isin(STEP_KINDS).to_numpy()
    if bad.any():
        raise _line(path, frame, "kind", bad, f"a step kind ({', '.join(STEP_KINDS)})")


def check_steps(path: Path, frame: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """`frame` (steps.csv, or its packed copy, at `path`) if it has the header kvbench writes,
    a known kind on every row, and rows that add up to summary.json's `num_steps`."""
    _header(path, frame, STEP_COLUMNS, "steps table")
    check_step_kinds(path, frame)
    external = summary.get("external") is True
    counts = [name for name in (*STEP_COLUMNS, *STEP_COLUMNS_LATER) if name not in STEP_NOT_COUNTS]
    _whole_numbers(path, frame, counts, external)
    _finite(path, frame, STEP_FINITE)
    expected = summary.get("num_steps")
    if isinstance(expected, int):
        total = int(frame["num_steps"].sum())
        if total != expected:
            rows = f"{len(frame)} rows of {total} steps" if len(frame) else "no rows"
            raise KvbenchError(f"{path}: {rows}, but summary.json's 'num_steps' is {expected}")
    return frame


def check_requests(path: Path, frame: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """`frame` (requests.csv at `path`) if it has the header kvbench writes and one row per
    request summary.json counts as `completed`."""
    _header(path, frame, REQUEST_COLUMNS, "requests table")
    external = summary.get("external") is True
    _whole_numbers(path, frame, REQUEST_COUNTS, external)
    _finite(path, frame, REQUEST_FINITE)
    # TPOT is undefined (NaN) for a one-token output only
    tpot = frame["tpot_s"].to_numpy(dtype=np.float64)
    bad = ~np.isfinite(tpot) & (frame["output_len"].to_numpy(dtype=np.float64) > 1)
    if bad.any():
        raise _line(path, frame, "tpot_s", bad, "a finite number (the output has more than one token)")
    if len(frame) != summary["completed"]:
        rows = f"{len(frame)} rows" if len(frame) else "no rows"
        raise KvbenchError(f"{path}: {rows}, but summary.json's 'completed' is {summary['completed']}")
    return frame
