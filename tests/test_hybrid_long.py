"""The long-context setting of benchmarks/hybrid_occupancy.py (`--long`): Gemma 3 12B with the
budget an H200 leaves it, on the first 30 s of Mooncake's conversation trace at its own
timestamps (87 requests, prompts of 12.5K tokens on average against a 1,024-token window).

The real allocators and scheduler run on the cost model, as the committed table's replay does;
what is asserted is what the table's reading rests on: every engine serves every request on the
same budget, the categories partition the arena, and freeing window blocks is what lets hybrid
and jenga batch more than paged.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.hybrid_occupancy import COLUMNS, ENGINES, long_cell, long_tables

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
MOONCAKE = SHARED / "mooncake" / "conversation_trace.jsonl"
WINDOW_S = 30.0

pytestmark = pytest.mark.skipif(
    not MOONCAKE.is_file(), reason=f"Mooncake's conversation trace not present at {MOONCAKE}"
)


@pytest.fixture(scope="module")
def traces():
    """Name traces through the shared folder of copies, as the benchmark's command line does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVBENCH_TRACE_DIR", str(SHARED))
        yield


@pytest.fixture(scope="module")
def runs(traces) -> dict[str, dict]:
    return {engine: long_cell(engine, WINDOW_S) for engine in ENGINES}


def test_every_engine_serves_every_request_of_the_window_on_one_budget(runs):
    budgets = {r["kv_budget_bytes"] for r in runs.values()}
    assert len(budgets) == 1  # the same bytes for every engine
    assert all(r["kv_budget_source"].startswith("--emulate-gpu h200-141gb") for r in runs.values())
    for r in runs.values():
        assert r["num_requests"] == r["completed"] == 87
        # nothing in the trace exceeds the model's context, and the filter says so
        assert (r["dropped_requests"], r["dropped_of"], r["dropped_longer_than"]) == (0, 12_031, 131_072)


@pytest.mark.parametrize("key", ["occupancy", "occupancy_saturated"])
def test_categories_partition_the_arena_in_both_weightings(runs, key):
    for engine, r in runs.items():
        shares = r[key]
        assert shares is not None, f"{engine} never saturated in the window"
        assert math.isclose(sum(shares[c] for c in COLUMNS), 1.0, abs_tol=1e-9), engine
        assert shares["mapped_idle"] == 0.0  # vmm's category alone


def test_freeing_window_blocks_is_what_lets_hybrid_and_jenga_batch_more(runs):
    paged = runs["paged"]
    # paged keeps every window layer's old tokens: they outweigh all the tokens steps still read
    assert paged["occupancy"]["outside_window"] > paged["occupancy"]["token_states"]
    for engine in ("hybrid", "jenga"):
        r = runs[engine]
        # what they still hold behind the window is mostly prompts during their prefill step
        assert r["occupancy"]["outside_window"] < paged["occupancy"]["outside_window"] / 2
        assert r["mean_batched_requests_saturated"] > 2 * paged["mean_batched_requests_saturated"]
        assert r["occupancy_saturated"]["token_states"] > 2 * paged["occupancy_saturated"]["token_states"]
    # equal-byte pages round nothing; orca-oracle reserves each request's final length up front
    assert runs["hybrid"]["occupancy"]["allocator_overhead"] == 0.0
    assert runs["orca-oracle"]["occupancy"]["reservation"] > runs["paged"]["occupancy"]["reservation"]
    assert runs["orca-oracle"]["mean_batched_requests"] < paged["mean_batched_requests"]


def test_the_table_names_the_budget_the_drops_and_every_row(traces):
    text = long_tables(10.0)
    head = text.splitlines()[0]
    assert "its first 10 s" in head and "0 of the trace's 12,031 dropped" in head
    rows = [line for line in text.splitlines() if line.startswith("| ") and "engine" not in line]
    engines = [*ENGINES, "paged, 8x the budget"]
    assert [row.split(" | ")[0][2:] for row in rows] == engines * 3  # main table, both weightings
