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


# A refit made outside a reproduction names that reproduction's runs from its folder.
REFITS = {"calibration-opt13b": RESULTS / "reproduce" / "opt-13b-h200"}


def _run_path(name: str, page: Path) -> Path | None:
    """The run a cost file or a held-out page names: from the repository's root, from the
    reproduction the file calibrates (`<reproduction>/calibration/cost.json`), or from the one
    reproduction a refit outside it names (REFITS). Never from another reproduction that holds a
    run of the same name: a run missing here must not be found in a sibling's copy."""
    folder = page.parent.parent
    bases = [ROOT, folder, *([REFITS[page.parent.name]] if page.parent.name in REFITS else [])]
    return next((b / name / "summary.json" for b in bases if (b / name / "summary.json").is_file()), None)


def test_a_run_missing_from_its_reproduction_is_not_found_in_a_sibling():
    """Both quick reproductions hold `fig2/orca-max`: the one a cost file names is its own."""
    cost = RESULTS / "reproduce" / "quick-real-opt-1.3b" / "calibration" / "cost.json"
    assert (RESULTS / "reproduce" / "quick-real" / "fig2" / "orca-max" / "summary.json").is_file()
    assert _run_path("fig2/orca-max", cost) == cost.parent.parent / "fig2" / "orca-max" / "summary.json"
    assert _run_path("fig2/no-such-engine", cost) is None
    elsewhere = RESULTS / "reference" / "somewhere" / "cost.json"
    assert _run_path("fig2/orca-max", elsewhere) is None


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
        lost = [run for run in sorted(runs) if _run_path(run, cost) is None]
        missing += [f"{cost.relative_to(ROOT)}: {run}" for run in lost]
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
            found = _run_path(check["run"], path)
            assert found is not None, f"{path.relative_to(ROOT)}: {check['run']}"
            value = json.loads(found.read_text(encoding="utf-8")).get(check["metric"])
            checked += 1
            if value is None or abs(value - check["real"]) > 1e-9 * max(1.0, abs(value)):
                wrong.append(f"{path.relative_to(ROOT)}: {check['run']} {check['metric']}")
    assert checked >= 1500 and wrong == []
