"""What kvbench reports, defined once: occupancy categories (`occupancy`), latency percentiles
(`latency`) and the per-request and per-run summaries (`summary`). docs/FOUNDATION.md gives
the formulas.
"""
