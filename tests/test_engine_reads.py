"""Which engine reads which arena flag (`engines.EngineSpec.reads`), pinned by what a run does.

The CLI refuses a flag no engine of a run reads (`kvbench.cli.options.refuse_unread_engine_flags`):
so each engine's table entry must be true both ways. A flag an engine does not read leaves its
run identical, step for step; a flag it reads changes the run (at a setting where it can: Qwen3's
40,960-token length is no power of two, so a buddy arena's max-length extents are not first fit's,
and a queue of long requests presses every engine's memory).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from engines import BLOCKS, ENGINES, FIT, PAGES, SWAP, WATERMARK
from kvbench.cli.options import ENGINE_FLAGS
from kvbench.config import ENGINE_FIELDS, RunConfig
from kvbench.simulate import simulate
from kvbench.sweep.grid import GRID, Cell, cell_config
from workloads.spec import WorkloadSpec

# a value other than the default for each option, as the flags that set it give it
CHANGED = {
    FIT: {"contiguous_fit": "first-fit"},
    BLOCKS: {"block_size": 64},
    WATERMARK: {"watermark": 0.3},
    SWAP: {"preemption": "swap", "swap_space_gib": 8.0},
    PAGES: {"vmm_layout": "per-request", "vmm_page_kib": 256, "vmm_map": "ahead"},
}
# every request arrives at once; 10 GiB of Qwen3-0.6B's K/V is 93,622 slots: two 40,960-token
# extents first fit, one buddy block of 65,536; 120 requests of 1,200 tokens ask for 1.5x the
# slots, with no cap on the batch below memory's, so block-table engines admit until memory is
# full and grow into preemptions (paged 13, vmm 46); 200 output tokens keep the run short
WORKLOAD = WorkloadSpec(source="fixed:prompt=1000,output=200", rate=float("inf"), num_requests=120)
BASE = RunConfig("paged", model="qwen3-0.6b", workload=WORKLOAD, kv_cache_gib=10.0, max_num_seqs=1024)


def _run(engine: str, **changed) -> tuple:
    """What a run did, step by step, and what it measured (the summary less the flags it echoes)."""
    config = dataclasses.replace(BASE, engine=engine, **changed)
    result = simulate(config)
    echoed = {"engine", *changed}
    summary = {k: v for k, v in result.summary.items() if k not in echoed}
    return result.run.steps, summary


@pytest.fixture(scope="module")
def defaults() -> dict[str, tuple]:
    return {engine: _run(engine) for engine in ENGINES}


def test_every_option_is_read_by_some_engine_and_the_tables_agree():
    """An option no engine reads would be refused everywhere; a flag the CLI does not name could
    never be refused; a flag set for one option here and another in the CLI would be tested for
    the wrong one."""
    assert set().union(*(spec.reads for spec in ENGINES.values())) == set(CHANGED)
    assert set(ENGINE_FIELDS.values()) == set(CHANGED) and set(ENGINE_FLAGS) == set(ENGINE_FIELDS)
    assert {name: option for option, names in CHANGED.items() for name in names} == ENGINE_FIELDS


def test_a_sweep_cell_runs_its_engine_at_the_defaults_of_what_it_does_not_read():
    """A sweep of --block-sizes 8,16 --watermark 0.05 over orca-oracle and paged: the orca cell at
    block size 8 runs, and records, what shaped it (in a process of its own too, whose command
    line must not carry the flags its engine would refuse)."""
    base = dataclasses.replace(BASE, watermark=0.05, preemption="swap")
    orca = cell_config(base, Cell(GRID, "orca-oracle", "sharegpt-paper", 5.0, 8, 10.0, 3))
    paged = cell_config(base, Cell(GRID, "paged", "sharegpt-paper", 5.0, 8, 10.0, 3))
    assert (orca.block_size, orca.watermark, orca.preemption) == (16, 0.01, "recompute")
    assert (paged.block_size, paged.watermark, paged.preemption) == (8, 0.05, "swap")
    assert dataclasses.replace(orca, engine="paged", block_size=8, watermark=0.05, preemption="swap") == paged


UNREAD = [(e, o) for e, spec in ENGINES.items() for o in CHANGED if o not in spec.reads]
READ = [(e, o) for e, spec in ENGINES.items() for o in sorted(spec.reads)]  # one order in every process


@pytest.mark.parametrize("engine,option", UNREAD, ids=[f"{e}-{o}" for e, o in UNREAD])
def test_an_option_the_engine_does_not_read_leaves_its_run_as_it_was(defaults, engine, option):
    steps, summary = _run(engine, **CHANGED[option])
    assert summary == defaults[engine][1]
    assert steps == defaults[engine][0]


@pytest.mark.parametrize("engine,option", READ, ids=[f"{e}-{o}" for e, o in READ])
def test_an_option_the_engine_reads_changes_its_run(defaults, engine, option):
    steps, summary = _run(engine, **CHANGED[option])
    assert (steps, summary) != defaults[engine]


def test_a_run_records_only_what_shaped_it(tmp_path):
    """A config built in Python (no CLI to refuse its flags) runs, and writes into config.json,
    the defaults of what its engine does not read, and --swap-space-gib only under swap."""
    from kvbench.simulate import write_result

    small = dataclasses.replace(BASE, workload=dataclasses.replace(WORKLOAD, num_requests=5))
    orca = simulate(dataclasses.replace(small, engine="orca-oracle", block_size=32, watermark=0.2))
    assert (orca.prepared.config.block_size, orca.prepared.config.watermark) == (16, 0.01)
    write_result(orca, tmp_path / "orca")
    written = json.loads((tmp_path / "orca" / "config.json").read_text())
    assert (written["block_size"], written["watermark"]) == (16, 0.01)
    paged = simulate(dataclasses.replace(small, block_size=32, swap_space_gib=8.0))
    assert (paged.prepared.config.block_size, paged.prepared.config.swap_space_gib) == (32, 4.0)
    swapping = simulate(dataclasses.replace(small, preemption="swap", swap_space_gib=8.0))
    assert swapping.prepared.config.swap_space_gib == 8.0


def test_a_cell_recorded_with_a_value_its_engine_ignores_still_resumes(tmp_path):
    """A sweep written before its cells ran at the defaults of what their engine ignores recorded
    the sweep's value (orca-oracle at block size 8): that cannot have changed the run, so the
    resume check passes it; a value the engine reads still counts."""
    from kvbench.simulate import write_result
    from kvbench.sweep.cell import config_differences

    small = dataclasses.replace(BASE, workload=dataclasses.replace(WORKLOAD, num_requests=5))
    for engine, field, value, differs in (
        ("orca-oracle", "block_size", 8, []),
        ("orca-oracle", "watermark", 0.2, []),
        ("paged", "swap_space_gib", 8.0, []),
        ("paged", "block_size", 8, ["block_size"]),
        ("orca-oracle", "contiguous_fit", "first-fit", ["contiguous_fit"]),
    ):
        config = dataclasses.replace(small, engine=engine)
        folder = tmp_path / f"{engine}-{field}"
        write_result(simulate(config), folder)
        recorded = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**recorded, field: value}))
        assert config_differences(config, folder) == differs, (engine, field)
