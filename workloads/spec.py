"""Workload specs: one string and a few options name any trace kvbench can build.

`--trace SPEC` (simulate) and `kvbench trace make SPEC` accept:

| SPEC | lengths from |
|---|---|
| `sharegpt-paper`, `alpaca-paper` | the paper presets (Fig. 11 means, vLLM's filter) |
| `fixed:prompt=512,output=128` | constant lengths |
| `uniform:prompt=10..100,output=20..200` | uniform, bounds inclusive |
| `lognormal:prompt_mean=161,prompt_cv=1.5,output_mean=338,output_cv=1` | lognormal by mean and CV |
| `empirical:FILE` | (prompt, output) pairs resampled from any trace file |
| `sharegpt:FILE`, `alpaca:FILE` | a text dataset, tokenized with `--tokenizer DIR` |
| `dataset:FILE_OR_DIR?prompt=COL&response=COL` | any local dataset with text columns |
| `FILE` | a trace file: kvbench JSONL/CSV/Parquet, Azure CSV, vidur/etalon CSV, Mooncake JSONL |

Then, in this order: conversations (`chat_turns`: the lengths become each turn's new query
and answer, the prompt is the history plus the query cut to `max_history` tokens, and turns
are ordered turn-major so a conversation's next turn comes after the other conversations'
current one), the `max_total_len` filter (after the history is added), a shared prefix,
parallel samples or beams, and arrival times (`arrivals`): a file with timestamps replays
them (scaled and windowed) unless another process is asked for; anything else needs a `--rate`.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.flag_ranges import MAX_REQUESTS  # the CLI's bound: one limit, not two
from kvbench.requests import MAX_ARRIVAL_S, Trace, too_late
from workloads import arrivals, sharing, synthetic
from workloads.columns import Columns, columns_of, to_trace
from workloads.presets import PRESETS
from workloads.registry import TRACES, trace_file

ARRIVALS = ("poisson", "gamma", "constant", "all", "replay")
DEFAULT_NUM_REQUESTS = 1000  # for sources that generate lengths


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that makes a trace; written to config.json so a run can be rebuilt."""

    source: str = "sharegpt-paper"
    num_requests: int | None = None  # None: 1000 generated, or every row of a file (in the window)
    seed: int = 0
    arrivals: str | None = None  # None: replay timestamps if the source has them, else poisson
    rate: float | None = None  # req/s for poisson, gamma, constant
    burstiness: float = 1.0  # gamma shape: 1 is Poisson, below 1 burstier
    time_scale: float = 1.0  # replay: 2 plays the trace twice as fast
    window_start_s: float = 0.0  # replay: skip requests before this time
    window_duration_s: float | None = None  # replay: keep requests within this span
    tokenizer: str | None = None  # text datasets: a local tokenizer folder
    text_filter: bool = True  # text datasets: vLLM's ShareGPT filter (skips are counted)
    n: int = 1  # parallel samples per request
    beam_width: int = 1
    prefix: str | None = None  # shared prefix: tokens, or fewshot-1 (80) / fewshot-5 (341)
    prefix_groups: int = 1
    chat_turns: int | None = None  # group requests into conversations of this many turns
    max_history: int = 1024  # conversations: prompt = history truncated to the last L tokens
    max_total_len: int | None = None  # drop (and count) requests with prompt + output above this


def build_trace(spec: WorkloadSpec) -> Trace:
    """The trace a spec names, deterministic for its seed."""
    _check(spec)
    length_rng, arrival_rng, share_rng = np.random.default_rng(spec.seed).spawn(3)
    cols, timestamps, hash_block = _lengths(spec, length_rng)
    if spec.chat_turns:
        cols = sharing.multi_turn(cols.prompt_len, cols.output_len, spec.chat_turns, spec.max_history)
        # turn-major order: every conversation's first turn, then every second turn, ... so a
        # turn arrives well after the one before it (an open-loop trace cannot wait for the answer)
        cols = cols.take(np.argsort(cols.turn, kind="stable"))
    # after the chat's history, which a turn's prompt holds (a dropped turn's exchange still
    # counts as history for the turns after it: the conversation happened, the trace skips it)
    if spec.max_total_len is not None:
        cols = _drop_longer(cols, spec.max_total_len)
    if spec.prefix:
        cols = sharing.with_shared_prefix(cols, _prefix_tokens(spec.prefix), spec.prefix_groups, share_rng)
    if spec.n > 1:
        cols = sharing.with_parallel_samples(cols, spec.n)
    if spec.beam_width > 1:
        cols = sharing.with_beam_width(cols, spec.beam_width)
    cols = _arrivals(spec, cols, timestamps, arrival_rng)
    name = spec.source if spec.source in PRESETS else Path(spec.source.split(":", 1)[-1]).stem
    trace = to_trace(cols, name, spec.source, hash_block_size=hash_block)
    return replace(trace, meta={**trace.meta, "workload": _describe(spec)})


FLAG_NAMES = {
    "source": "--trace",
    "window_start_s": "--window-start",
    "window_duration_s": "--window-duration",
}
"""The command-line flag of each `WorkloadSpec` field spelled otherwise than `--<field-with-dashes>`."""


def flag(field: str) -> str:
    """The flag that sets `field`: errors name what the user typed, not the field behind it."""
    return FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def _check(spec: WorkloadSpec) -> None:
    """Refuse every bad value up front, naming its flag (the helpers below name their own
    parameters, `start_s` or `max_prompt_len`, which a command-line user never typed)."""
    if spec.num_requests is not None and spec.num_requests < 1:
        raise KvbenchError(f"--num-requests must be an integer >= 1, got {spec.num_requests}")
    if spec.num_requests is not None and spec.num_requests > MAX_REQUESTS:
        raise KvbenchError(f"--num-requests must be at most {MAX_REQUESTS:,}, got {spec.num_requests:,}")
    if spec.seed < 0:
        raise KvbenchError(f"--seed must be an integer >= 0, got {spec.seed}")
    if spec.arrivals is not None and spec.arrivals not in ARRIVALS:
        raise KvbenchError(f"unknown --arrivals {spec.arrivals!r}; choose one of: {', '.join(ARRIVALS)}")
    if spec.rate is not None:
        arrivals.check_rate(spec.rate)
        if math.isinf(spec.rate) and spec.arrivals in ("gamma", "constant"):
            raise KvbenchError(f"--rate inf: --arrivals {spec.arrivals} needs a finite rate")
    for field, value in (
        ("n", spec.n),
        ("beam_width", spec.beam_width),
        ("prefix_groups", spec.prefix_groups),
        ("chat_turns", 1 if spec.chat_turns is None else spec.chat_turns),
        ("max_history", spec.max_history),
    ):
        if value < 1:
            raise KvbenchError(f"{flag(field)} must be >= 1, got {value}")
    if spec.max_total_len is not None and spec.max_total_len < 2:
        raise KvbenchError(f"--max-total-len must be >= 2 (prompt and output), got {spec.max_total_len}")
    for field in ("burstiness", "time_scale", "window_duration_s"):
        value = getattr(spec, field)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise KvbenchError(f"{flag(field)} must be a finite number > 0, got {value}")
    if not (math.isfinite(spec.window_start_s) and spec.window_start_s >= 0):
        raise KvbenchError(f"--window-start must be a finite number >= 0, got {spec.window_start_s}")


TEXT_KINDS = ("sharegpt", "alpaca", "dataset")  # KIND:FILE specs of text, tokenized (`workloads.text`)


def _refuse_text_flags(spec: WorkloadSpec) -> None:
    """--tokenizer and --no-text-filter shape a text dataset only: with a trace of lengths they
    would be ignored while config.json (or a made trace's header) recorded them."""
    kinds = ", ".join(f"{kind}:FILE" for kind in TEXT_KINDS)
    for flag, given in (
        ("--tokenizer", spec.tokenizer is not None),
        ("--no-text-filter", not spec.text_filter),
    ):
        if given:
            raise KvbenchError(
                f"{flag} applies to text datasets ({kinds}), not --trace {spec.source}: leave it out"
            )


def _lengths(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[Columns, bool, int | None]:
    """Columns with lengths (and timestamps, if the source has them), and the hash block size."""
    kind, _, rest = spec.source.partition(":")
    count = spec.num_requests or DEFAULT_NUM_REQUESTS
    if not (kind in TEXT_KINDS and rest):
        _refuse_text_flags(spec)
    if spec.source in PRESETS:
        return _generated(synthetic.PresetLengths(spec.source), count, rng), False, None
    if kind in LENGTH_KINDS and rest:
        return _generated(parse_lengths(kind, rest), count, rng), False, None
    if kind == "empirical" and rest:
        source = synthetic.EmpiricalLengths.from_trace(_read(rest))
        return _generated(source, count, rng), False, None
    if kind in TEXT_KINDS and rest:
        from workloads.text import text_source

        trace = text_source(kind, rest, spec.tokenizer, spec.num_requests, spec.seed, spec.text_filter)
        return columns_of(trace), False, None
    if spec.source in TRACES or Path(spec.source).is_file():  # a registered name or a path
        trace = _read(spec.source)
        cols = columns_of(trace)
        return cols, bool(cols.extra.get("timestamps", True)), trace.hash_block_size
    raise _unknown_source(spec.source)


FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
"""Suffixes that make a --trace a file name: what kvbench reads, and the text datasets' .json."""


def _unknown_source(source: str) -> KvbenchError:
    """The error for a --trace that names nothing kvbench knows. A folder, or a name that looks
    like a path (a slash, a trace file's suffix), was meant as a file: say that it is a folder
    or missing, rather than list presets and specs the user did not mean."""
    path = Path(source)
    if not source.strip():  # Path('') is the current folder
        return KvbenchError("--trace: an empty spec names no trace")
    if path.is_dir():
        return KvbenchError(f"--trace {source}: is a folder, not a trace file")
    if "/" in source or os.sep in source or path.suffix.lower() in FILE_SUFFIXES:
        return KvbenchError(f"--trace {source}: no such file")
    return KvbenchError(
        f"unknown --trace {source!r}: not a preset ({', '.join(PRESETS)}), a registered trace "
        f"({', '.join(TRACES)}), a spec "
        "(fixed:, uniform:, lognormal:, empirical:FILE, sharegpt:FILE, alpaca:FILE, dataset:FILE) "
        "or an existing trace file"
    )


LENGTH_KINDS = {
    "fixed": ("prompt", "output"),
    "uniform": ("prompt", "output"),
    "lognormal": ("prompt_mean", "prompt_cv", "output_mean", "output_cv"),
}


def parse_lengths(kind: str, body: str) -> synthetic.LengthSource:
    """`prompt=161,prompt_cv=1.5,...` (uniform bounds as `lo..hi`) -> a length source."""
    where = f"--trace {kind}:{body}"
    values: dict[str, str] = {}
    for item in body.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in LENGTH_KINDS[kind]:
            raise KvbenchError(f"{where}: expected {'=..., '.join(LENGTH_KINDS[kind])}=..., got {item!r}")
        if key.strip() in values:
            raise KvbenchError(f"{where}: {key.strip()}= is given twice")
        values[key.strip()] = value.strip()
    missing = [k for k in LENGTH_KINDS[kind] if k not in values]
    if missing:
        raise KvbenchError(f"{where}: missing {missing[0]}=")
    try:
        if kind == "fixed":
            return synthetic.FixedLengths(_int(values["prompt"], "prompt"), _int(values["output"], "output"))
        if kind == "uniform":
            (p0, p1), (o0, o1) = (_bounds(values[k], k) for k in ("prompt", "output"))
            return synthetic.UniformLengths(p0, p1, o0, o1)
        return synthetic.LognormalLengths(*(_float(values[k], k) for k in LENGTH_KINDS["lognormal"]))
    except ValueError as error:
        raise KvbenchError(f"{where}: {error}") from None


def _bounds(text: str, key: str) -> tuple[int, int]:
    low, sep, high = text.partition("..")
    if not sep:
        raise ValueError(f"{key} must be LOW..HIGH, got {text!r}")
    return _int(low, f"{key} LOW"), _int(high, f"{key} HIGH")


def _int(text: str, key: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {text!r}") from None


def _float(text: str, key: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{key} must be a number, got {text!r}") from None


def _read(path: str) -> Trace:
    from workloads.tracefile import read_trace

    return read_trace(trace_file(path))  # a registered name resolves to its verified local copy


def _generated(source: synthetic.LengthSource, count: int, rng: np.random.Generator) -> Columns:
    prompt, output = source.sample(count, rng)  # (N,), (N,)
    return Columns(arrival_s=np.zeros(count), prompt_len=prompt, output_len=output)


def _drop_longer(cols: Columns, limit: int) -> Columns:
    """Keep requests with prompt + output <= limit; what was dropped goes to `Trace.meta`."""
    keep = np.flatnonzero(cols.prompt_len + cols.output_len <= limit)  # (K,) rows kept
    if len(keep) == 0:
        raise KvbenchError(f"--max-total-len {limit}: every one of the {len(cols)} requests is longer")
    dropped = len(cols) - len(keep)
    out = cols.take(keep) if dropped else cols
    out.extra = {
        **cols.extra, "dropped_longer_than": limit, "dropped_requests": dropped, "dropped_of": len(cols)
    }  # fmt: skip
    return out


DROP_KEYS = ("dropped_requests", "dropped_of", "dropped_longer_than")
"""What `--max-total-len` removed, as `Trace.meta` and a run's summary.json record it."""


def dropped(trace: Trace) -> dict:
    """The `DROP_KEYS` of `trace` (empty without `--max-total-len`), for a run's summary."""
    return {key: trace.meta[key] for key in DROP_KEYS if key in trace.meta}


def dropped_line(record: dict) -> str | None:
    """One line saying how many requests `--max-total-len` dropped and why, from `dropped`'s keys."""
    if "dropped_requests" not in record:
        return None
    limit, count = record["dropped_longer_than"], record["dropped_requests"]
    of = f" of {record['dropped_of']}" if "dropped_of" in record else ""
    return (
        f"--max-total-len {limit}: dropped {count}{of} requests longer than {limit} tokens (prompt + output)"
    )


def _prefix_tokens(prefix: str) -> int:
    if prefix in sharing.PREFIX_PRESETS:
        return sharing.PREFIX_PRESETS[prefix]
    try:
        tokens = int(prefix)
    except ValueError:
        choices = ", ".join(sharing.PREFIX_PRESETS)
        raise KvbenchError(f"--prefix must be a token count or one of {choices}, got {prefix!r}") from None
    if tokens < 1:
        raise KvbenchError(f"--prefix must be >= 1 token, got {tokens}")
    return tokens


def _arrivals(spec: WorkloadSpec, cols: Columns, timestamps: bool, rng: np.random.Generator) -> Columns:
    """Set arrival times; for replays, cut the window and the request count."""
    kind = spec.arrivals or ("replay" if timestamps else "poisson")
    replay_only = [
        f
        for f in ("time_scale", "window_start_s", "window_duration_s")
        if spec.__dict__[f] != getattr(WorkloadSpec, f)
    ]
    if replay_only and kind != "replay":  # ignoring them would silently run another workload
        why = f"--arrivals {kind}" if spec.arrivals else f"{spec.source}, which has no timestamps"
        raise KvbenchError(f"{flag(replay_only[0])} applies to replayed timestamps, not to {why}")
    if kind == "replay":
        if not timestamps:
            raise KvbenchError(f"--arrivals replay: {spec.source} has no timestamps; give --rate instead")
        if spec.rate is not None:  # a replay has no rate: ignoring it would run another workload
            raise KvbenchError(
                f"--rate {spec.rate:g}: {spec.source} has timestamps, which are replayed; give "
                "--arrivals poisson to draw arrivals at that rate, or --time-scale to replay faster"
            )
        index, times = arrivals.replay(
            cols.arrival_s, spec.time_scale, spec.window_start_s, spec.window_duration_s
        )
        if len(index) == 0:
            raise KvbenchError(
                f"{spec.source}: no request lies in the --window-start/--window-duration window"
            )
        _check_enough_rows(spec, cols, len(index))
        if spec.num_requests is not None:
            index, times = index[: spec.num_requests], times[: spec.num_requests]
        _check_span(times, f"--time-scale {spec.time_scale:g}: {spec.source} replayed")
        picked = cols.take(index)
        picked.arrival_s = times
        return picked
    if _from_file(spec):  # generated columns hold the count drawn (less those --max-total-len drops)
        _check_enough_rows(spec, cols, len(cols))
    if spec.num_requests is not None and spec.num_requests < len(cols):
        cols = cols.take(np.arange(spec.num_requests))
    if kind == "all":
        process = arrivals.AllAtOnce()
    else:
        if spec.rate is None:
            why = "has no timestamps" if not timestamps else f"is re-timed by --arrivals {kind}"
            raise KvbenchError(f"--trace {spec.source} {why}: give --rate R (requests/s) or --arrivals all")
        arrivals.check_rate(spec.rate)
        process = {
            "poisson": lambda: arrivals.Poisson(spec.rate),
            "gamma": lambda: arrivals.Gamma(spec.rate, spec.burstiness),
            "constant": lambda: arrivals.Constant(spec.rate),
        }[kind]()
    cols.arrival_s = process.times(len(cols), rng)
    drawn = f"--rate {spec.rate:g} with {len(cols)} requests" if spec.rate else spec.source
    _check_span(cols.arrival_s, drawn)
    return cols


def _check_span(times: np.ndarray, what: str) -> None:
    """Refuse arrivals past MAX_ARRIVAL_S, naming the flags that put them there: a rate's drawn
    arrivals may pass it where their expected span did not (`flag_ranges.check_arrival_span`),
    and a replay stretched by --time-scale may pass it where the file did not."""
    if len(times) and times[-1] > MAX_ARRIVAL_S:
        raise KvbenchError(f"{what}: arrivals reach {times[-1]:,.0f} s; they {too_late()}")


def _check_enough_rows(spec: WorkloadSpec, cols: Columns, available: int) -> None:
    """Refuse a --num-requests above the `available` requests a file holds (replayed: in the
    window; after --max-total-len): running what is there would run fewer requests than
    config.json records. Text datasets refuse it likewise (`workloads.text`)."""
    if spec.num_requests is None or spec.num_requests <= available:
        return
    held = f"{spec.source} has {len(cols)} rows"
    if "dropped_of" in cols.extra:
        of, limit = cols.extra["dropped_of"], spec.max_total_len
        held = f"{spec.source} has {of} rows, {len(cols)} within --max-total-len {limit}"
    if available < len(cols):
        held += f", {available} of them in the --window-start/--window-duration window"
    raise KvbenchError(
        f"--num-requests {spec.num_requests}: {held}; give at most {available}, or leave "
        "--num-requests out to run them all"
    )


def file_rows(spec: WorkloadSpec) -> int | None:
    """The requests a trace file gives this spec when --num-requests is left out (after
    --max-total-len and conversations; a replay: in its window), or None where the count is
    drawn (presets, length distributions) or read to order (text datasets). A sweep sizes its
    implicit counts by it (`kvbench.sweep.grid.cell_config`)."""
    if not _from_file(spec):
        return None
    # the rows do not depend on the seed or the rate: one read serves every cell of a sweep
    return _rows(replace(spec, num_requests=None, seed=0, rate=None if spec.rate is None else 1.0))


def _from_file(spec: WorkloadSpec) -> bool:
    """Whether the spec's requests are a trace file's rows (a path or a registered trace), not
    drawn from a preset or a distribution, nor read from a text dataset."""
    kind, _, rest = spec.source.partition(":")
    drawn = kind in (*LENGTH_KINDS, "empirical", "sharegpt", "alpaca", "dataset") and bool(rest)
    return spec.source not in PRESETS and not drawn


@functools.lru_cache(maxsize=16)
def _rows(spec: WorkloadSpec) -> int:
    return len(build_trace(spec).requests)


def _describe(spec: WorkloadSpec) -> dict:
    return {k: v for k, v in spec.__dict__.items() if v is not None}
