"""Tests written against the mutants that survived the metrics scope's mutation run
(docs/MUTATION.md, results/mutation/metrics/): each pins a value or a refusal a user sees
(a metric, a trace row refused, a column read) that the direct tests of
`tests/test_definitions.py` and `tests/test_trace_validation.py` left open.

Timelines run the real engine, scheduler and allocator; records come from kvbench's own
record builders; traces from `workloads.columns.to_trace` and `read_trace`.
"""

from __future__ import annotations
