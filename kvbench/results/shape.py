"""The shape of saved results, as far as their readers rely on it (kvbench.results.load).

A summary.json edited by hand, half-written by a killed process or from another tool can
parse as JSON and still hold a string where a metric belongs; a report would then crash in a
plot or print a wrong column. These checks name the file and the key instead. Keys they do
not know pass: collectors and metrics add keys over time, and older folders lack some.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.errors import KvbenchError


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# summary.json's shape, as far as readers rely on it: these keys hold text, these hold shares of
# the arena by category, and metric keys hold numbers (or null: not measured)
MODES = ("real", "simulated")  # summary.json's `mode`: decoded on a device, or priced by a cost model
SUMMARY_TEXT = ("engine", "model", "trace", "trace_source", "mode", "kv_budget_source", "device", "dtype")
SUMMARY_SHARES = ("occupancy", "occupancy_saturated")
_METRIC_SUFFIXES = ("_s", "_bytes", "_throughput", "_fraction", "_rate", "_requests", "_tokens", "_slots")
_METRIC_KEYS = ("completed", "goodput", "kv_bytes_per_token", "energy_j", "percentiles")


def check_summary(path: Path, summary: dict) -> dict:
    """`summary` (read from `path`) if every key readers use has its type, else a one-line
    error naming the file and the key."""
    for key, value in summary.items():
        if key == "mode":  # another would be read as one of these (calibrate: as simulated)
            ok, want = value in MODES, f"one of {', '.join(MODES)}"
        elif key in SUMMARY_TEXT:
            ok, want = value is None or isinstance(value, str), "a string"
        elif key in SUMMARY_SHARES:
            ok = isinstance(value, dict) and all(_is_number(v) for v in value.values())
            want = "an object of numbers"
        elif key == "percentiles":
            ok, want = isinstance(value, list) and all(_is_number(v) for v in value), "a list of numbers"
        elif key in _METRIC_KEYS or key.endswith(_METRIC_SUFFIXES) or key.startswith("num_"):
            ok, want = value is None or _is_number(value), "a number"
        else:
            continue
        if not ok:
            raise KvbenchError(f"{path}: {key!r} must be {want}, got {json.dumps(value)[:40]}")
    return summary


def check_config(path: Path, config: dict) -> dict:
    """`config` (config.json at `path`) if the settings readers use have their types."""
    workload = config.get("workload", {})
    if not isinstance(workload, dict):
        raise KvbenchError(f"{path}: 'workload' must be an object, got {json.dumps(workload)[:40]}")
    for where, key in ((workload, "rate"), (config, "block_size"), (config, "kv_cache_gib")):
        value = where.get(key)
        if value is not None and not _is_number(value):
            raise KvbenchError(f"{path}: {key!r} must be a number, got {json.dumps(value)[:40]}")
    return config


STEP_TEXT = ("kind",)  # steps.csv's only column of words: prefill, decode or mixed (chunked prefill)
SWEEP_KEYS = ("engine", "status")  # every sweep.csv row names its engine and outcome
SUSTAINED_TEXT = (
    "engine",
    "model",
    "trace",
    "emulate_gpu",
    "threshold_source",
    "how",
)  # sustained.csv's words
SWEEP_TEXT = ("cell_id", "role", "status", "engine", "model", "trace", "emulate_gpu", "mode", "error")
FIGURE_TEXT = ("figure", "engine", "workload", "metric")  # a reproduction's figure.csv: the rest are numbers
