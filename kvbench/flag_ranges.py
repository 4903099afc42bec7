"""Every numeric command-line flag's admissible range, checked in one place.

typer parses `nan`, `inf`, `-1` and `10000000000` as valid numbers, and a value outside a
flag's range does not fail where it is typed: it fails downstream (numpy refusing a seed, NaN
sampling, a 70 GiB array) with a message naming an internal parameter, or not at all. So
every command checks its numeric flags, by parameter name, against `RANGES` before it does
anything (`cli_options.user_errors` calls `check_flags`), and a test asserts that every
numeric flag of every command has an entry: a new flag cannot be added unchecked.

A name means the same quantity in every command that has it (`--seed`, `--num-requests`),
so one table serves them all. Upper bounds are sanity limits, documented here:

- `MAX_REQUESTS`: 10 million requests in one trace (a trace's arrays cost about 100 bytes a
  request; the largest public traces are a few million rows).
- `MAX_SEED`: seeds are 32-bit (numpy and torch both take them; larger ones only alias).
- `MAX_WIDTH`: 1,024 parallel samples or beams per request.
- `MAX_INT`: every other count stays below 2**31.
- `MAX_STEP_COST_S`: a cost-model constant (a step's fixed cost, its cost per token, per KV
  token, ...) of at most an hour. The slowest real step is seconds; far beyond, a run's
  latencies overflow float64 to Infinity (their variance squares them) and `report` refuses
  the summary.json the simulation wrote. A cost file's constants (`--cost-model`) share it.
- `MAX_ARRIVAL_S` (`kvbench.requests`, a trace file's bound too): a run's arrivals span at most
  1e9 s (about 31.7 years), where float64 still resolves a tenth of a microsecond; far past it,
  arrival and finish times round to the same value and latencies read 0. Arrivals span about
  num_requests / rate seconds, so:
  `MIN_RATE`, 1e-6 req/s (one request in 11.6 days: no serving workload), and, with
  --num-requests given, num_requests / rate <= MAX_ARRIVAL_S (`check_arrival_span`);
  `MIN_TIME_SCALE`, 1e-3: the public traces span days (~1e6 s), and a replay stretched 1000-fold
  stays within the span; a file spanning more, stretched past it, is refused once its times are
  replayed, naming --time-scale (`workloads.spec`), as a rate whose draw passes it is.

`check_workload` adds the combinations of workload flags that one flag would silently undo, and
`check_distinct` refuses a list flag that names a value twice (`--rates 1,1`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.requests import MAX_ARRIVAL_S

MAX_REQUESTS = 10_000_000
MAX_SEED = 2**32 - 1
MAX_WIDTH = 1024
MAX_INT = 2**31 - 1
MAX_STEP_COST_S = 3600.0
MIN_RATE = 1e-6
MIN_TIME_SCALE = 1e-3


@dataclass(frozen=True)
class Range:
    """Where a number may lie: [low, high], either end open or absent; finite unless `allow_inf`."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself refused (a positive quantity)
    high_open: bool = False
    allow_inf: bool = False  # +inf is meaningful (`--rate inf`: everything at once)
    zero_ok: bool = False  # 0 is accepted besides [low, high] (`--temperature 0`: greedy)

    def admits(self, value: float) -> bool:
        if math.isnan(value) or (math.isinf(value) and not (self.allow_inf and value > 0)):
            return False
        if self.zero_ok and value == 0:
            return True
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if math.isinf(value):
            return True
        return self.high is None or value < self.high or (value == self.high and not self.high_open)

    def describe(self, integer: bool) -> str:
        """`positive`, `an integer in 0..4294967295`, `a number in [0, 1)`, ..."""
        kind = "an integer" if integer else "a finite number"
        low, high = self.low, self.high
        if integer and low == 1:
            text = "a positive integer" + (f" up to {_plain(high)}" if high is not None else "")
        elif integer and low is not None and high is not None:
            text = f"{kind} in {_plain(low)}..{_plain(high)}"
        elif low is not None and high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"{kind} in {left}{_plain(low)}, {_plain(high)}{right}"
        elif low == 0 and self.low_open:
            text = "positive" if not integer else "a positive integer"
        elif low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_plain(low)}"
        else:
            text = kind
        if self.zero_ok:
            text = f"0 or {text}"
        return text + (" (or inf)" if self.allow_inf else "")


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1, low_open=True)  # (0, 1]: a share of memory
COUNT = Range(1, MAX_INT)
SEED = Range(0, MAX_SEED)
STEP_COST = Range(0, MAX_STEP_COST_S)

# parameter name (the flag without its dashes, `-` as `_`) -> its range
RANGES: dict[str, Range] = {
    # simulate, run, sweep: the budget, the scheduler and the cost model
    "gpu_memory_utilization": FRACTION,
    "max_num_seqs": COUNT,
    "max_num_batched_tokens": COUNT,
    "watermark": Range(0, 1, high_open=True),
    "swap_space_gib": NON_NEGATIVE,
    "vmm_page_kib": Range(4, MAX_INT),  # and a multiple of 4 (kvbench.vmm.pages)
    "cost_fixed_s": STEP_COST,
    "knee_gain": FRACTION,  # a share of the linear fit's error: 0 would keep no knee
    "cost_per_token_s": STEP_COST,
    "cost_per_kv_token_s": STEP_COST,
    # run: real decoding (below 1e-4 a temperature divides float32 logits into inf and NaN)
    "temperature": Range(1e-4, 100, zero_ok=True),
    "weights_seed": SEED,
    "tensor_parallel": COUNT,
    "hf_batch_size": COUNT,
    "hf_block_size": Range(4, MAX_INT),  # transformers' minimum
    "hf_memory": FRACTION,
    # the workload (simulate, run, sweep, trace make, demo, reproduce)
    "num_requests": Range(1, MAX_REQUESTS),
    "seed": SEED,
    "rate": Range(MIN_RATE, allow_inf=True),
    "burstiness": POSITIVE,
    "time_scale": Range(MIN_TIME_SCALE),
    "window_start": NON_NEGATIVE,
    "window_duration": POSITIVE,
    "max_total_len": Range(2, MAX_INT),
    "n": Range(1, MAX_WIDTH),
    "beam_width": Range(1, MAX_WIDTH),
    "prefix_groups": Range(1, MAX_REQUESTS),
    "chat_turns": Range(1, MAX_REQUESTS),
    "max_history": COUNT,
    # kernels
    "kv_heads": COUNT,
    "head_dim": COUNT,  # and a power of two in 16..256 (cli_kernels)
    "repeats": COUNT,  # kernels: timed calls per cell; sweep: runs per cell
    "warmup": Range(0, MAX_INT),
    "max_gib": POSITIVE,
    # sweep
    "cell_timeout": POSITIVE,
    "deadline_s": POSITIVE,  # seconds this invocation may run
    "latency_threshold": POSITIVE,
    # the default bound is this many times the lowest unloaded latency: at 1 or below, every rate fails
    "threshold_multiple": Range(1, low_open=True),
    "bisect": Range(0, 64),  # each round is one more rate per engine
    "bracket": POSITIVE,  # relative width (first fail - last pass) / last pass
    "baseline_rate": Range(MIN_RATE),
    "baseline_requests": Range(1, MAX_REQUESTS),
    "duration": Range(0, MAX_ARRIVAL_S, low_open=True),  # seconds of arrivals per loaded cell
    "parallel_gpus": COUNT,
    "ray_retries": Range(0, 1000),
    # reproduce
    # the paper's rates times this: its lowest are about 0.1 req/s (Figure 12's real grid starts at
    # 0.125; a width of 6 divides a sequence rate of 1), so at 1e-3 they stay above MIN_RATE
    "rate_scale": Range(1e-3),
}


# numeric parameters whose whole range a more specific check owns (its message says more)
CHECKED_ELSEWHERE: dict[str, str] = {
    "kv_cache_gib": "kvbench.budget.budget_from_gib: positive, and at most budget.MAX_SLOTS token slots",
    "block_size": "kvbench.config.prepare: a power of two, at most the arena's slots",
}


def flag_name(name: str) -> str:
    """The flag a parameter is typed as: `cell_timeout` -> `--cell-timeout`."""
    return "--" + name.replace("_", "-")


def check_flag(name: str, value: Any) -> None:
    """Refuse `value` for parameter `name` if it is a number outside its range (unlisted
    numbers must at least be finite)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or name in CHECKED_ELSEWHERE:
        return
    allowed = RANGES.get(name, Range())
    if not allowed.admits(float(value)):
        raise KvbenchError(
            f"{flag_name(name)} must be {allowed.describe(isinstance(value, int))}, got {value!r}"
        )


# `kvbench sweep`'s comma-separated axes: parameter name -> how an item reads, so that values
# compare as the sweep parses them (`--rates 1,1.0` names one rate twice)
LISTS: dict[str, Callable[[str], object]] = {
    "engines": str,
    "rates": float,
    "block_sizes": int,
    "kv_cache_gib": float,
    "seeds": int,
}
REPEATED = ("trace",)  # options given once per value (`sweep --trace A --trace B`)


def check_distinct(flag: str, items: Sequence[str], read: Callable[[str], object] = str) -> None:
    """Refuse a list that names one value twice (`--rates 1,1`, `--engines paged,paged`): the
    repeat would be dropped silently, so the command would run fewer cells than its line reads,
    or run one twice. Items compare as `read` makes them; an item `read` refuses, or an empty
    one (`--engines paged,,`), is left to the flag's own parser, whose message says what it
    expects."""
    seen: dict[object, str] = {}
    for item in items:
        if not item:
            continue
        try:
            value = read(item)
        except ValueError:
            continue
        if value in seen:
            same = "" if seen[value] == item else f" (the same as {seen[value]})"
            raise KvbenchError(f"{flag}: {item}{same} is given twice")
        seen[value] = item


def check_list(name: str, value: Any) -> None:
    """`check_distinct` for parameter `name` where it is one of `LISTS` (comma-separated text)
    or `REPEATED` (a list of the values of an option given several times)."""
    if isinstance(value, str) and name in LISTS:
        check_distinct(flag_name(name), [item.strip() for item in value.split(",")], LISTS[name])
    elif isinstance(value, list) and name in REPEATED:
        check_distinct(flag_name(name), [str(item).strip() for item in value], _same_file)


def _same_file(spec: str) -> str:
    """A trace spec as it compares: a file by its resolved path (`tr/a.csv` and `./tr/a.csv`
    are one trace), anything else (a preset, `fixed:...`) as written."""
    path = Path(spec)
    return str(path.resolve()) if path.is_file() else spec


def check_flags(values: dict[str, Any]) -> None:
    """`check_flag` and `check_list` for every parameter of a command (None: a flag not given)."""
    for name, value in values.items():
        check_flag(name, value)
        check_list(name, value)


def check_workload(spec) -> None:
    """Refuse workload flags that another flag would silently ignore, naming both.

    `spec` is a `workloads.spec.WorkloadSpec`; its numbers are checked by their flags' ranges.
    (Replay-only flags on a trace that is not replayed are refused by `workloads.spec`, which
    knows whether the source has timestamps.)
    """
    fields = {"window_start": spec.window_start_s, "window_duration": spec.window_duration_s}
    fields |= {name: getattr(spec, name) for name in (
        "num_requests", "seed", "rate", "burstiness", "time_scale", "max_total_len", "n", "beam_width",
        "prefix_groups", "chat_turns", "max_history")}  # fmt: skip
    check_flags({name: value for name, value in fields.items() if value is not None})
    if spec.num_requests is not None and spec.rate is not None:
        check_arrival_span(spec.num_requests, spec.rate, "--num-requests", "--rate")
    arrivals = spec.arrivals
    if spec.rate is not None and arrivals in ("all", "replay"):
        raise KvbenchError(
            f"--rate {spec.rate:g} and --arrivals {arrivals} contradict each other: --arrivals {arrivals} "
            "uses no rate; give only one of them"
        )


def check_arrival_span(count: int, rate: float, count_flag: str, rate_flag: str) -> None:
    """Refuse `count` requests at `rate` whose arrivals would span more than MAX_ARRIVAL_S
    (the module docstring says why), naming the two flags that set them."""
    if count / rate > MAX_ARRIVAL_S:
        raise KvbenchError(
            f"{count_flag} {count} at {rate_flag} {rate:g} spreads arrivals over {count / rate:,.0f} s, "
            f"past {MAX_ARRIVAL_S:,} s, where float64 times lose their microseconds: raise the rate "
            "or lower the count"
        )


def check_seed_span(largest: int, flags: str) -> None:
    """Refuse a command whose repeats would derive a seed past MAX_SEED (`largest`, from the
    `flags` named), before its first run: otherwise the runs of the lower seeds are written, then
    the command fails on a --seed the user never typed."""
    if largest > MAX_SEED:
        raise KvbenchError(f"{flags} derive seeds up to {largest}, past the largest seed ({MAX_SEED})")


def check_dependents(spec) -> None:
    """Refuse a workload flag given without the flag whose feature it shapes, which would
    ignore it (compared with the defaults, as `check_burstiness`; command line only)."""
    defaults = type(spec)()
    if spec.prefix_groups != defaults.prefix_groups and spec.prefix is None:
        raise KvbenchError(
            f"--prefix-groups {spec.prefix_groups} splits the requests sharing --prefix among groups: "
            "give --prefix, or leave it out"
        )
    if spec.max_history != defaults.max_history and spec.chat_turns is None:
        raise KvbenchError(
            f"--max-history {spec.max_history} cuts a conversation's history (--chat-turns): give "
            "--chat-turns, or leave it out"
        )
    if spec.prefix is not None and not spec.prefix.strip():  # read as no prefix, recorded as one
        raise KvbenchError("--prefix '' names no prefix: give a prefix spec, or leave it out")


def check_burstiness(spec) -> None:
    """`--burstiness` without `--arrivals gamma` would be ignored. Checked on the command line
    only: a sweep's baseline cells replace gamma arrivals by sparse constant ones on purpose."""
    arrivals = spec.arrivals
    if spec.burstiness != 1.0 and arrivals != "gamma":
        raise KvbenchError(
            f"--burstiness {spec.burstiness:g} shapes --arrivals gamma only, "
            f"not --arrivals {arrivals or 'poisson/replay (the default)'}"
        )
