"""Jobs: config -> trace -> engine -> runner -> results; `simulate` uses the cost model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from engines import get_engine
from engines.hybrid import group_shapes
from engines.scheduler import Scheduler
from kvbench.config import Prepared, RunConfig, prepare
from kvbench.cost_model import CostModelRunner, KvReads
from kvbench.engine import Engine, EngineRun, StepRecord
from kvbench.metrics.latency import ItlTable
from kvbench.metrics.summary import RequestRecord, request_record, summarize
from kvbench.results.files import environment, write_csv, write_json, write_run_atomically
from kvbench.runner import Runner
from workloads.spec import dropped


@dataclass(frozen=True)
class RunResult:
    prepared: Prepared
    run: EngineRun
    requests: list[RequestRecord]
    summary: dict
    step_columns: tuple[dict, ...] = ()  # collectors' columns, one dict per step row (real runs)


def execute(
    config: RunConfig, make_runner: Callable[[Scheduler], Runner], *, mode: str, coalesce: bool,
    prepared: Prepared | None = None, extra: dict | None = None,
) -> RunResult:  # fmt: skip
    """Drive the config's trace through its engine with `make_runner(scheduler)`; summarize."""
    prepared = prepared or prepare(config)
    scheduler = get_engine(config.engine).build(prepared.options)
    windows = group_shapes(prepared.model.groups)  # outside_window for every engine
    run = Engine(scheduler, make_runner(scheduler), coalesce=coalesce, windows=windows).run(prepared.trace)
    itls = ItlTable.of(run.sequences)
    records = [request_record(seq, m) for seq, m in zip(run.sequences, itls.maxima.tolist(), strict=True)]
    by_group = getattr(scheduler.allocator, "prefix_hits_by_group", None)  # caching per KV group
    hits = by_group([record.request_id for record in records]) if by_group else None
    summary = {
        "engine": config.engine,
        "model": config.model,
        "trace": prepared.trace.name,
        "trace_source": prepared.trace.source,
        "mode": mode,
        "kv_budget_bytes": prepared.budget.budget_bytes,
        "kv_budget_source": prepared.budget.source,
        "kv_bytes_per_token": prepared.model.kv_bytes_per_token,
        **dropped(prepared.trace),  # what --max-total-len removed from the trace
        **(extra or {}),
        **summarize(run, records, itls, percentiles=config.percentiles, slo=config.slo, hits_by_group=hits),
    }
    return RunResult(prepared, run, records, summary)


def simulate(config: RunConfig, *, coalesce: bool = True, prepared: Prepared | None = None) -> RunResult:
    """Replay the config's trace through the real allocator and scheduler in simulated time."""
    prepared = prepared or prepare(config)
    # window layers read their window, not the whole context: priced per KV group
    reads = KvReads.of(group_shapes(prepared.model.groups))
    ahead = config.engine == "vmm" and config.vmm_map == "ahead"  # the allocator reserves ahead

    def runner(scheduler: Scheduler) -> CostModelRunner:
        return CostModelRunner(prepared.cost, reads, lookahead=scheduler.allocator if ahead else None)

    return execute(config, runner, mode="simulated", coalesce=coalesce, prepared=prepared)


def write_result(result: RunResult, out: Path, tables: bool = True) -> None:
    """The run folder; without `tables`, only its config, environment and summary."""
    # the constants the run used (the roofline's, a calibrated file's, or the flags'), beside the
    # `cost_model` path that asked for them
    config = {**result.prepared.config.to_dict(), "cost_model_constants": asdict(result.prepared.cost)}
    if result.prepared.config.cost_model is not None:
        from kvbench.calibrate.fit import cost_file_digest

        config["cost_model_sha256"] = cost_file_digest(result.prepared.config.cost_model)

    def write(tmp: Path) -> None:
        write_json(tmp / "config.json", config)
        write_json(tmp / "env.json", environment())
        if tables:
            write_csv(tmp / "steps.csv", result.run.steps, StepRecord, extra=result.step_columns)
            write_csv(tmp / "requests.csv", result.requests, RequestRecord)
        write_json(tmp / "summary.json", result.summary)

    write_run_atomically(out, write)
