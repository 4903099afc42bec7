"""results/reference/hybrid-long-chunked-windows-sim: the prediction committed before the real runs
of the chunked long-context windows is what its make.py gives from the committed cells and cost
file, to the digit, so the real runs are read against a prediction anyone can remake; and the
windows it predicts are the ones `tools/device_call.sh hybrid-long-chunked-windows` runs."""

from __future__ import annotations

import json
import os
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reference" / "hybrid-long-chunked-windows-sim"
SHARED = Path(os.environ.get("KVBENCH_TRACE_DIR") or ROOT.parent / "shared" / "traces")
MOONCAKE = SHARED / "mooncake" / "conversation_trace.jsonl"


def flat(rows: list[dict]) -> dict[str, float]:
    """Every number of the prediction, keyed by window, engine and metric."""
    out = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, dict):
                out.update({f"{row['window_start_s']}/{key}/{m}": v for m, v in value.items()})
            else:
                out[f"{row['window_start_s']}/{key}"] = value
    return out


@pytest.fixture(scope="module")
def make():
    return runpy.run_path(str(FOLDER / "make.py"))


def test_the_windows_predicted_are_the_ones_the_device_job_runs(make):
    job = (ROOT / "tools" / "device_call.sh").read_text(encoding="utf-8")
    block = job.split("hybrid-long-chunked-windows)", 1)[1].split(";;", 1)[0]
    starts = [int(s) for s in re.findall(r'"(\d+) [a-z,]+"', block)]
    assert starts == [350, 700]
    assert set(starts) < set(make["STARTS"]) and make["STARTS"][0] == 0  # the fitted window beside them
    setting = ("--chunked-prefill", "--emulate-gpu h200-141gb", "--trace mooncake-conv",
               "--window-duration 30", "--max-total-len 131072", "--model gemma-3-12b")  # fmt: skip
    for flag in setting:
        assert flag in block  # the setting of the cells make.py simulates
    engines = {e for setting in re.findall(r'"\d+ ([a-z,]+)"', block) for e in setting.split(",")}
    assert engines == set(make["ENGINES"])


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"Mooncake's conversation trace not present at {MOONCAKE}")
def test_the_committed_prediction_is_what_make_py_gives(make, monkeypatch):
    monkeypatch.setenv("KVBENCH_TRACE_DIR", str(SHARED))
    rows = make["predict"]()
    committed = json.loads((FOLDER / "prediction.json").read_text(encoding="utf-8"))
    assert committed["cost_model"] == "results/reference/hybrid-long-chunked-split-real/calibration/cost.json"
    assert [r["window_start_s"] for r in committed["windows"]] == [0, 350, 700]
    assert flat(json.loads(json.dumps(rows))) == pytest.approx(flat(committed["windows"]), rel=1e-9)
    table = (FOLDER / "table.md").read_text(encoding="utf-8")
    assert table == "\n".join(make["table"](rows)) + "\n"
    # the fitted window reproduces paged's real run (its own steps were fitted)
    assert rows[0]["paged"]["request_throughput"] == pytest.approx(0.726, rel=0.01)


def test_the_check_written_before_the_runs_reads_the_rule_as_stated_and_names_what_has_not_run():
    """check.py, committed with the prediction, is the reading rule as code: an error of exactly
    10 % either way is within target, a hair more is not; the fitted window is shown and not
    counted; a window whose cells are absent is named as not run, never read as a pass."""
    check = runpy.run_path(str(FOLDER / "check.py"))
    holds = check["holds"]
    assert holds(1.0, 1.1) and holds(1.0, 0.9) and holds(2.0, 2.2)
    assert not holds(1.0, 1.1001) and not holds(1.0, 0.8999)
    assert check["error"](0.722, 0.802) == pytest.approx(0.1108, abs=1e-4)  # predicted / real - 1
    found = check["windows"]()
    assert [row["window_start_s"] for row, _ in found] == [0, 350, 700]
    assert set(found[0][1]) == {"paged", "hybrid", "jenga"}  # the warmed-up run of the fitted window
    lines = check["reading"]()
    counted = next(line for line in lines if line.startswith("The later windows"))
    real = FOLDER.parent / "hybrid-long-chunked-windows-real"
    if not real.exists():  # before the device job has run
        assert "0 of 0 predictions" in counted and "Not run yet: 350 s: paged" in counted
    assert sum(line.startswith("| 0-30 | ") for line in lines) == 3 + 1 + 6  # metrics, ratios, steps
