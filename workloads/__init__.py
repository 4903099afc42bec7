"""Workloads: what every engine replays. See docs/WORKLOADS.md.

- `build_trace(WorkloadSpec(...))`: a trace from a preset, spec or file plus options.
- `read_trace(path)` / `write_trace(trace, path)`: kvbench's trace format and the public traces.
- `trace_stats(trace)`: counts, rates, length percentiles, prefix reuse.
"""

from workloads.presets import PRESETS, make_trace
from workloads.spec import WorkloadSpec, build_trace
from workloads.stats import trace_stats
from workloads.tracefile import read_trace, write_trace

__all__ = ["PRESETS", "WorkloadSpec", "build_trace", "make_trace", "read_trace", "trace_stats", "write_trace"]
