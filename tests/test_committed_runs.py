"""Every run a committed result rests on is committed: the cells of a real sweep's finished rows,
and the runs a committed cost file was fitted on and held out on. A run that a report or a fit
read on the GPU machine but that never came back with the call (a copy kept its source's file
times while the call brought back only newer files) is found here, not by a reader months on."""

from __future__ import annotations

import csv
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def _real_sweeps() -> list[Path]:
    found = []
    for table in sorted(RESULTS.rglob("sweep.csv")):
        plan = table.parent / "sweep.json"
        if plan.is_file() and json.loads(plan.read_text(encoding="utf-8")).get("mode") == "real":
            found.append(table)
    return found


def test_every_finished_cell_of_a_committed_real_sweep_is_committed():
    sweeps = _real_sweeps()
    assert len(sweeps) >= 20  # the reproduction's panels and the reference sweeps
    missing, cells = [], 0
    for table in sweeps:
        with table.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row["status"] == "ok":
                    cells += 1
                    cell = table.parent / "cells" / row["cell_id"]
                    if not (cell / "summary.json").is_file():
                        missing.append(str(cell.relative_to(ROOT)))
    assert cells >= 600 and missing == []


def _run_found(name: str, cost: Path) -> bool:
    """A cost file names runs from the repository's root, from the reproduction it calibrates
    (`<reproduction>/calibration/cost.json`), or from the reproduction it refits."""
    bases = [ROOT, cost.parent.parent, *sorted((RESULTS / "reproduce").iterdir())]
    return any((base / name / "summary.json").is_file() for base in bases)


def test_every_run_a_committed_cost_file_names_is_committed():
    files = sorted(p for p in RESULTS.rglob("cost.json") if "earlier" not in p.parts)
    assert len(files) >= 10
    missing, named = [], 0
    for cost in files:
        data = json.loads(cost.read_text(encoding="utf-8"))
        runs = {*data["runs"], *(check["run"] for check in data.get("held_out", []))}
        for fit in data.get("engines", {}).values():
            runs |= set(fit["runs"])
        named += len(runs)
        missing += [f"{cost.relative_to(ROOT)}: {run}" for run in sorted(runs) if not _run_found(run, cost)]
    assert named >= 500 and missing == []


def test_each_held_out_check_is_of_the_run_now_at_its_path():
    """A held-out check records the real run's metric beside the simulation's; the run now at
    the path it names must still give that value. A run set aside and its path reused by a run
    made again (a panel rerun at another commit) would otherwise be read as the one checked."""
    checked, wrong = 0, []
    for path in sorted(RESULTS.rglob("*.json")):
        if "earlier" in path.parts or path.name in ("summary.json", "config.json", "env.json"):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("held_out"), list):
            continue
        for check in data["held_out"]:
            if not isinstance(check, dict) or "real" not in check:
                continue
            bases = [ROOT, path.parent.parent, *sorted((RESULTS / "reproduce").iterdir())]
            found = next((b / check["run"] / "summary.json" for b in bases
                          if (b / check["run"] / "summary.json").is_file()), None)  # fmt: skip
            assert found is not None, f"{path.relative_to(ROOT)}: {check['run']}"
            value = json.loads(found.read_text(encoding="utf-8")).get(check["metric"])
            checked += 1
            if value is None or abs(value - check["real"]) > 1e-9 * max(1.0, abs(value)):
                wrong.append(f"{path.relative_to(ROOT)}: {check['run']} {check['metric']}")
    assert checked >= 1500 and wrong == []
