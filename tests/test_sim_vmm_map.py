"""`--vmm-map` simulated: `kvbench simulate` and a simulated sweep's cells map ahead as a real
run's `--vmm-map ahead` does (`CostModelRunner(lookahead=)`: the allocator reserves the pages),
price what the steps map, and record it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import kvbench
from kvbench.calibrate.check import read_config
from kvbench.config import prepare
from kvbench.simulate import simulate
from tests.test_cli import kvbench as cli
from tests.test_sweep import rows_of

# every request at t=0: no arrival falls between steps, so a shorter step cannot change what the
# scheduler sees next, and both modes must schedule the very same steps; 2 GiB of OPT-13B is
# tight enough that requests are preempted and their pages unmapped mid-decode
TINY = (
    "--engine", "vmm", "--model", "opt-13b", "--kv-cache-gib", "2", "--trace", "sharegpt-paper",
    "--num-requests", "40", "--arrivals", "all", "--seed", "3", "--step-by-step",
)  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same tiny vmm simulation, mapping `sync` and `ahead`."""
    root = tmp_path_factory.mktemp("vmm_map")
    for how in ("sync", "ahead"):
        proc = cli("simulate", *TINY, "--vmm-map", how, "--out", str(root / how))
        assert proc.returncode == 0, proc.stderr
    return {how: root / how for how in ("sync", "ahead")}


def test_ahead_maps_reserved_pages_off_the_steps_and_prices_every_map_a_step_makes(runs):
    """Mapping ahead is an allocation (`VirtualAllocator.look_ahead`): the pages reserved for a
    decode segment's successor are mapped while it runs and counted in no step, so steps.csv
    counts fewer maps inside the steps than `sync` does; every map and unmap it does count is
    priced inside its step, prefill or decode (nothing is assumed hidden)."""
    sync, ahead = kvbench.load_run(runs["sync"]), kvbench.load_run(runs["ahead"])
    assert sync.summary["completed"] == ahead.summary["completed"] == 40
    assert sync.summary["num_preemptions"] > 0 and ahead.summary["num_preemptions"] > 0
    decode = ahead.steps["kind"] == "decode"
    in_steps = ahead.steps.loc[decode, "mapped_pages"].sum()
    assert 0 < in_steps < sync.steps.loc[sync.steps["kind"] == "decode", "mapped_pages"].sum()
    # the same run with free driver calls: every request arrived at t=0, so no step time can
    # change the schedule, and each row is shorter by exactly the maps steps.csv counts for it
    config = read_config(runs["ahead"])
    prepared = prepare(config)
    free = replace(prepared.cost, per_map_page_s=0.0, per_unmap_page_s=0.0)
    unpriced = simulate(config, coalesce=False, prepared=replace(prepared, cost=free)).run.steps
    cost = ahead.config["cost_model_constants"]
    assert cost["per_map_page_s"] > 0 and cost["per_unmap_page_s"] > 0
    steps = ahead.steps
    assert steps["mapped_pages"].tolist() == [row.mapped_pages for row in unpriced]
    priced = (
        cost["per_map_page_s"] * steps["mapped_pages"] + cost["per_unmap_page_s"] * steps["unmapped_pages"]
    )
    saved = steps["duration_s"].to_numpy() - np.array([row.duration_s for row in unpriced])
    # steps.csv's durations are differences of absolute times (an ulp at 65 s is 1.4e-14 s): a
    # tolerance of 1e-12 s is a 35,000th of one page's map, so one page misplaced still fails
    assert saved == pytest.approx(priced.to_numpy(), rel=0, abs=1e-12)
    assert ((decode & (steps["mapped_pages"] > 0)).sum() > 0) and (steps["unmapped_pages"] > 0).any()


def test_the_mode_is_recorded_in_config_json_and_rebuilds_the_run(runs):
    for how, folder in runs.items():
        assert json.loads((folder / "config.json").read_text())["vmm_map"] == how
    again = simulate(read_config(runs["ahead"]), coalesce=False).summary
    assert again["makespan_s"] == kvbench.load_run(runs["ahead"]).summary["makespan_s"]


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_a_bad_vmm_map_is_one_line_and_exit_2(tmp_path, command):
    args = ("--engine", "vmm") if command == "simulate" else ("--engines", "vmm", "--rates", "2")
    proc = cli(command, *args, "--num-requests", "5", "--vmm-map", "later", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: --vmm-map must be one of sync, ahead, got 'later'"], proc.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("isolate", [False, True])
def test_a_simulated_sweep_cell_maps_ahead_when_told(tmp_path, isolate):
    out = tmp_path / "sweep"
    args = ["sweep", "--simulate", "--engines", "vmm", "--rates", "4", "--kv-cache-gib", "2",
            "--num-requests", "30", "--seeds", "3", "--vmm-map", "ahead", "--out", str(out)]  # fmt: skip
    proc = cli(*args, *(["--isolate"] if isolate else []))
    assert proc.returncode == 0, proc.stderr
    rows = rows_of(out / "sweep.csv")
    assert sorted(row["role"] for row in rows) == ["baseline", "grid"]
    for row in rows:  # the unloaded baseline too: one yardstick for the whole sweep
        cell = out / "cells" / row["cell_id"]
        config = read_config(cell)
        assert (
            config.vmm_map == "ahead" and json.loads((cell / "config.json").read_text())["vmm_map"] == "ahead"
        )
        if isolate:  # the child process was told on its command line
            command = json.loads((cell / "env.json").read_text())["command"]
            assert command[1] == "simulate" and command[command.index("--vmm-map") + 1] == "ahead"
        # and the cell ran it: its summary is the ahead simulation's, not the sync one's (the
        # unloaded baseline decodes each request alone in one segment: nothing to map ahead of)
        recorded = json.loads((cell / "summary.json").read_text())
        assert recorded["makespan_s"] == simulate(config).summary["makespan_s"]
        sync = simulate(replace(config, vmm_map="sync")).summary["makespan_s"]
        assert (sync != recorded["makespan_s"]) == (row["role"] == "grid")
