"""The vmm engine on costs fitted to the real OPT-13B runs, driver maps included.

    kvbench calibrate results/reference/vmm-occupancy-real/alpaca-paper-per-layer \
        results/reference/vmm-occupancy-real/alpaca-paper-per-request \
        --held-out results/reference/vmm-occupancy-real/sharegpt-paper-per-layer \
        --held-out results/reference/vmm-occupancy-real/sharegpt-paper-per-request \
        --out results/reference/vmm-calibration/cost.json
    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. python results/reference/vmm-calibration/make.py

Writes table.md beside this file: the held-out ShareGPT vmm runs simulated with the fitted page
costs and with the driver probe's (every other constant the fit's), and what the fitted costs
predict for vmm per-request mapping ahead (the allocator reserving the pages a segment will
reach) on both traces, beside the same runs mapped `sync` and the real runs mapped ahead (the
`-ahead-held` folders' seed 0: the same requests and arrivals). One simulation per row.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from kvbench.calibrate.check import read_config
from kvbench.results.files import write_text
from kvbench.results.load import load_run
from kvbench.simulate import simulate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REAL = ROOT / "results/reference/vmm-occupancy-real"
COST = HERE / "cost.json"
PROBE = {"per_map_page_s": 35.5e-6, "per_unmap_page_s": 22.3e-6}  # results/reference/vmm-probe, medians


def vmm_run(folder: str):
    (cell,) = [p.parent for p in (REAL / folder).glob("cells/vmm__*__seed-0__*/summary.json")]
    return load_run(cell)


def row(label: str, how: str, s: dict) -> str:
    """A run's line; the driver counts only a real run records ("-" for a simulated one): the
    maps made inside steps and their time, those made ahead (while the device ran) left out."""
    real = "vmm_maps" in s
    driver = (
        f"{s['vmm_maps'] - s['vmm_ahead_maps']:,} | {s['vmm_map_s'] - s['vmm_ahead_map_s']:.1f}"
        if real
        else "- | -"
    )
    return (
        f"| {label} | {how} | {s['request_throughput']:.2f} | {s['normalized_latency_s']:.4f} | "
        f"{s['mean_ttft_s']:.2f} | {driver} |"
    )


def simulated(run, cost: Path, **changes) -> dict:
    config = replace(read_config(run.path), device="cpu", cost_model=str(cost), **changes)
    return simulate(config).summary


def main() -> None:
    fitted = json.loads(COST.read_text())
    head = [
        "| run | how | completed req/s | normalized latency s/token | mean TTFT s | maps in steps"
        " | map time in steps s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    lines = ["Held out (ShareGPT; the fit saw Alpaca only):", "", *head]
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.json"
        probe.write_text(json.dumps({k: v for k, v in fitted.items() if k not in ("held_out",)} | PROBE))
        for layout in ("per-layer", "per-request"):
            run = vmm_run(f"sharegpt-paper-{layout}")
            label = f"sharegpt-paper vmm {layout}"
            lines.append(row(label, "real", run.summary))
            lines.append(row(label, "simulated, fitted page costs", simulated(run, COST)))
            lines.append(row(label, "simulated, probe page costs", simulated(run, probe)))
    lines += ["", "Predicted for mapping ahead with the pages reserved, and the real run:", "", *head]
    for trace in ("alpaca-paper", "sharegpt-paper"):
        run = vmm_run(f"{trace}-per-request")
        label = f"{trace} vmm per-request"
        lines.append(row(label, "real, sync", run.summary))
        lines.append(row(label, "simulated, sync", simulated(run, COST)))
        lines.append(row(label, "simulated, ahead (reserved)", simulated(run, COST, vmm_map="ahead")))
        lines.append(row(label, "real, ahead (reserved)", vmm_run(f"{trace}-per-request-ahead-held").summary))
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
