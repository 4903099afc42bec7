"""The cost model's terms beyond the linear three: what a fit assumed, the decode knee, page maps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engines import get_engine
from kvbench.calibrate.fit import calibrate, fit, fit_shape, load_cost_model
from kvbench.config import RunConfig, prepare
from kvbench.cost_model import MAP_PAGE_S, UNMAP_PAGE_S, CostModel, CostModelRunner
from kvbench.errors import KvbenchError
from kvbench.requests import Request
from kvbench.sequence import sequence_for
from kvbench.simulate import simulate, write_result
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
TRUE = dict(cost_fixed_s=0.012, cost_per_token_s=4e-5, cost_per_kv_token_s=3e-7)


def simulated(out: Path, rate: float, seed: int, **extra) -> Path:
    workload = WorkloadSpec("sharegpt-paper", num_requests=150, rate=rate, seed=seed)
    write_result(
        simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0, **TRUE, **extra)), out
    )
    return out


def test_a_fit_on_runs_without_swaps_assumes_the_swap_cost_and_one_with_swaps_measures_it(tmp_path):
    calm = simulated(tmp_path / "calm", 4.0, 0)
    swapping = simulated(tmp_path / "swapping", 30.0, 1, preemption="swap")
    assert json.loads((swapping / "summary.json").read_text())["num_preemptions"] > 0
    without = calibrate([calm], simulated_ok=True)
    roofline = prepare(RunConfig(engine="paged", kv_cache_gib=2.0)).cost  # opt-13b on the default GPU
    assert "per_swap_block_s" in without.cost.assumed
    assert without.cost.per_swap_block_s == roofline.per_swap_block_s  # the value used, written as used
    assert "10 us" in without.assumed_from["per_swap_block_s"]
    # nothing forks, maps pages or (in steps.csv) counts copies in these runs
    assert {"per_copy_slot_s", "per_map_page_s", "per_unmap_page_s"} <= set(without.cost.assumed)
    assert without.cost.per_map_page_s == MAP_PAGE_S and "vmm-probe" in without.assumed_from["per_map_page_s"]
    assert not {"fixed_s", "per_token_s", "per_kv_token_s", "per_prefill_s"} & set(without.cost.assumed)
    both = calibrate([calm, swapping], simulated_ok=True)
    assert "per_swap_block_s" not in both.cost.assumed and "per_swap_block_s" not in both.assumed_from
    assert both.cost.per_swap_block_s == pytest.approx(
        roofline.per_swap_block_s, rel=1e-6
    )  # measured: TRUE's
    # the file names them, and loading it exposes them
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(without.to_dict()))
    written = json.loads(path.read_text())
    assert written["assumed"] == list(without.cost.assumed)
    assert set(written["assumed_from"]) == set(written["assumed"])
    assert load_cost_model(str(path), "opt-13b").assumed == without.cost.assumed


def test_an_assumed_swap_cost_is_the_roofline_of_the_simulated_block_size(tmp_path):
    """The fit wrote its runs' 16-slot blocks' swap cost; a 64-slot simulation swaps 64-slot blocks."""
    path = tmp_path / "cost.json"
    path.write_text(
        json.dumps(calibrate([simulated(tmp_path / "calm", 4.0, 0)], simulated_ok=True).to_dict())
    )
    big = prepare(RunConfig(engine="paged", kv_cache_gib=2.0, block_size=64, cost_model=str(path))).cost
    assert (
        big.per_swap_block_s
        == prepare(RunConfig(engine="paged", kv_cache_gib=2.0, block_size=64)).cost.per_swap_block_s
    )
    assert big.assumed == tuple(json.loads(path.read_text())["assumed"])


def test_an_older_cost_file_assumes_what_it_lacks(tmp_path):
    path = tmp_path / "old.json"
    old = {"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8,
           "per_swap_block_s": 0.0, "per_prefill_s": 0.0}  # fmt: skip
    path.write_text(json.dumps(old))
    loaded = load_cost_model(str(path), "opt-13b")
    assert loaded.assumed == ("per_swap_block_s", "per_copy_slot_s", "per_map_page_s", "per_unmap_page_s")
    assert loaded.knee_batch is None and loaded.per_map_page_s == 0  # not in the file: 0 as loaded,
    used = prepare(RunConfig(engine="vmm", kv_cache_gib=2.0, cost_model=str(path))).cost
    assert (used.per_map_page_s, used.per_unmap_page_s) == (MAP_PAGE_S, UNMAP_PAGE_S)  # as simulated


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"knee_batch": 0}, "'knee_batch' must be a whole number >= 1 or null, got 0"),
        ({"knee_batch": 2.5}, "'knee_batch' must be a whole number >= 1 or null, got 2.5"),
        ({"assumed": ["per_swap_block"]}, "'assumed' must be a list of cost terms"),
        ({"per_map_page_s": -1}, "'per_map_page_s' must be a finite number >= 0, got -1"),
    ],
)
def test_bad_new_terms_in_a_cost_file_are_one_line(tmp_path, extra, message):
    path = tmp_path / "bad.json"
    good = {"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}
    path.write_text(json.dumps(good | extra))
    with pytest.raises(KvbenchError, match=message.replace("[", r"\[")) as raised:
        load_cost_model(str(path), "opt-13b")
    assert "\n" not in str(raised.value)


def decode_rows(batch: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Single decode steps as fit.py's count columns: steps, decode rows, context, then zeros."""
    ones = np.ones(len(batch))
    return np.column_stack([ones, batch, context, *(np.zeros((5, len(batch))))])


def test_the_fit_finds_a_known_knee():
    """Steps cost 5 ms + 20 us per row + 100 us more per row beyond 24 rows: the knee is found
    and the constants come back; without a knee in the data, the linear model stands."""
    rng = np.random.default_rng(0)
    batch = rng.integers(1, 65, 400).astype(np.float64)
    context = batch * rng.integers(100, 900, 400)
    true = 5e-3 + 20e-6 * batch + 4e-9 * context + 100e-6 * np.maximum(batch - 24, 0)
    durations = true * (1 + rng.normal(0, 0.002, 400))  # 0.2 % noise
    constants, knee = fit_shape(decode_rows(batch, context), durations, batch)
    assert knee is not None and abs(knee - 24) <= 1
    assert constants[-1] == pytest.approx(100e-6, rel=0.05)
    assert constants[0] == pytest.approx(5e-3, rel=0.05)
    linear = 5e-3 + 20e-6 * batch + 4e-9 * context
    constants, knee = fit_shape(decode_rows(batch, context), linear * (1 + rng.normal(0, 0.002, 400)), batch)
    assert knee is None and constants[-1] == 0


def test_the_opt13b_h200_decode_steps_bend_at_the_knee():
    """The measured decode steps of OPT-13B on the H200 (results/reference/real-decode-kernels):
    the linear model misses one by over 2 %; the knee fit is within 1 % of each, a third of the
    linear model's largest error, and costs more per row above its knee than below."""
    measured = json.loads((ROOT / "results/reference/real-decode-kernels/decode_step.json").read_text())
    points = {
        (p["batch"], p["context"]): p["step_ms"] / 1e3
        for p in measured["roofline"]
        if p["addressing"] == "paged"
    }
    batch = np.array([b for b, _ in points], dtype=np.float64)
    assert sorted(batch) == [8, 32, 64, 128]
    counts, durations = (
        decode_rows(batch, batch * np.array([c for _, c in points])),
        np.array(list(points.values())),
    )
    constants, knee = fit_shape(counts, durations, batch)
    assert knee == 32 and constants[-1] > 0
    bent = counts @ constants[:-1] + constants[-1] * np.maximum(batch - knee, 0)
    assert np.abs(bent / durations - 1).max() < 0.01
    straight = np.abs(counts @ fit(counts, durations) / durations - 1).max()  # the linear model's fit
    assert straight > 0.02 and np.abs(bent / durations - 1).max() < straight / 3
    cost = CostModel(*constants[:3], per_row_above_knee_s=constants[-1], knee_batch=knee)
    assert cost.above_knee(128) == pytest.approx(constants[-1] * 96) and cost.above_knee(20) == 0


def test_the_runner_charges_the_knee_on_decode_steps_only():
    base = CostModel(0.01, 1e-5, 1e-8)
    bent = replace(base, per_row_above_knee_s=2e-4, knee_batch=3)
    seqs = tuple(sequence_for(Request(i, 0.0, 10, 20)) for i in range(5))
    from engines.batch import Batch

    decode = Batch(seqs, False, 5, 60)
    prefill = Batch(seqs, True, 50, 50)
    extra = CostModelRunner(bent).run(decode, 4, 0.0, np.inf).durations - CostModelRunner(base).run(
        decode, 4, 0.0, np.inf
    ).durations  # fmt: skip
    assert extra == pytest.approx([2 * 2e-4] * 4, rel=1e-12)  # 5 rows, 2 past the knee, every step
    assert CostModelRunner(bent).run(prefill, 1, 0.0, np.inf).durations[0] == CostModelRunner(base).run(
        prefill, 1, 0.0, np.inf
    ).durations[0]  # fmt: skip


def test_a_batch_that_maps_pages_costs_exactly_that_much_more():
    """The real vmm allocator and scheduler of an OPT-13B run (per-layer layout: a page is a 2 MiB
    driver page in each of 80 tensors): the batch admitting requests carries their driver pages,
    and the cost model charges each exactly its measured map cost."""
    prepared = prepare(RunConfig(engine="vmm", kv_cache_gib=2.0))
    assert prepared.options.driver_pages == 2 * prepared.model.num_layers == 80
    scheduler = get_engine("vmm").build(prepared.options)
    for i in range(3):
        scheduler.add(sequence_for(Request(i, 0.0, 300, 50)))
    batch = scheduler.schedule()
    pages = scheduler.allocator.maps  # allocator pages mapped for the three prompts
    assert pages > 0 and batch.mapped_pages == 80 * pages and batch.unmapped_pages == 0
    free = replace(prepared.cost, per_map_page_s=0.0, per_unmap_page_s=0.0)
    charged = CostModelRunner(prepared.cost).run(batch, 1, 0.0, np.inf).durations[0]
    assert charged - CostModelRunner(free).run(batch, 1, 0.0, np.inf).durations[0] == pytest.approx(
        80 * pages * MAP_PAGE_S, rel=1e-12
    )  # fmt: skip
    unmapped = replace(batch, mapped_pages=0, unmapped_pages=7)
    charged = CostModelRunner(prepared.cost).run(unmapped, 1, 0.0, np.inf).durations[0]
    assert charged - CostModelRunner(free).run(unmapped, 1, 0.0, np.inf).durations[0] == pytest.approx(
        7 * UNMAP_PAGE_S, rel=1e-12
    )
    # the next decode batch maps nothing new until a sequence crosses a page: nothing charged
    assert scheduler.schedule().mapped_pages == 0


def test_mapping_ahead_reserves_the_next_segments_pages_and_prices_every_map_a_step_makes():
    """`--vmm-map ahead` simulated: every step pays for the pages it maps, as under `sync` (a
    prefill's and a decode segment's alike); what differs is that after a decode segment the
    allocator reserves the pages its batch reaches in another segment as long, mapped while the
    segment ran, so the next segment finds them held and maps none of them in its steps."""
    prepared = prepare(RunConfig(engine="vmm", kv_cache_gib=2.0, vmm_map="ahead"))
    scheduler = get_engine("vmm").build(prepared.options)
    alloc = scheduler.allocator
    for i in range(3):
        scheduler.add(sequence_for(Request(i, 0.0, 300, 600)))
    sync, ahead = CostModelRunner(prepared.cost), CostModelRunner(prepared.cost, lookahead=alloc)
    prefill = scheduler.schedule()
    assert prefill.is_prefill and prefill.mapped_pages > 0
    assert ahead.run(prefill, 1, 0.0, np.inf).durations[0] == sync.run(prefill, 1, 0.0, np.inf).durations[0]
    assert alloc.ahead_maps == 0  # a prefill reserves nothing
    for seq in prefill.seqs:
        seq.advance(1, 1.0)
    decode = scheduler.schedule()
    steps = 200  # from token 301 to 500: each sequence crosses from its second page (409) into a third
    alloc.grow(decode.seqs, steps)  # as the engine grows a segment for a runner allocating ahead
    assert decode.map_plan(steps).sum() == 3 * 80
    priced = sync.run(decode, steps, 0.0, np.inf).durations  # [steps]
    assert (ahead.run(decode, steps, 0.0, np.inf).durations == priced).all()  # nothing hidden
    assert alloc.ahead_maps == 3  # each sequence's fourth page (it reaches 700 next): reserved
    for seq in decode.seqs:
        seq.advance(steps, 2.0)
    following = scheduler.schedule()
    assert following.mapped_pages == 0 and following.map_plan(steps).sum() == 0  # held already
    workload = WorkloadSpec("sharegpt-paper", num_requests=60, rate=8.0, seed=3)

    def config(how: str) -> RunConfig:
        return RunConfig(engine="vmm", kv_cache_gib=2.0, vmm_map=how, workload=workload)

    in_steps = {
        how: sum(row.mapped_pages for row in simulate(config(how)).run.steps) for how in ("sync", "ahead")
    }  # on a run with arrivals, preemptions and idle pages reclaimed
    assert 0 < in_steps["ahead"] < in_steps["sync"]


def test_a_vmm_run_counts_its_page_maps_and_the_fit_prices_them(tmp_path):
    """steps.csv's `mapped_pages` and `unmapped_pages` count the driver pages each row mapped and
    unmapped, exactly what the cost model charged: a vmm run simulated with known map costs
    (a budget tight enough to reclaim idle pages) gives them back, and neither is assumed."""
    from kvbench.results.load import read_csv

    truth = {"model": "opt-13b", "fixed_s": 0.012, "per_token_s": 4e-5, "per_kv_token_s": 3e-7,
             "per_map_page_s": 4e-5, "per_unmap_page_s": 1.5e-5}  # fmt: skip
    model = tmp_path / "truth.json"
    model.write_text(json.dumps(truth))
    workload = WorkloadSpec("sharegpt-paper", num_requests=150, rate=8.0, seed=3)
    run = tmp_path / "vmm"
    write_result(
        simulate(RunConfig(engine="vmm", workload=workload, kv_cache_gib=2.0, cost_model=str(model))), run
    )
    steps = read_csv(run / "steps.csv")
    assert steps["mapped_pages"].sum() > 0 and steps["unmapped_pages"].sum() > 0
    assert (steps["mapped_pages"] % 80 == 0).all()  # whole pages of 80 per-layer tensors
    fitted = calibrate([run], simulated_ok=True)
    assert fitted.cost.per_map_page_s == pytest.approx(4e-5, rel=1e-6)
    assert fitted.cost.per_unmap_page_s == pytest.approx(1.5e-5, rel=1e-6)
    assert not {"per_map_page_s", "per_unmap_page_s"} & set(fitted.cost.assumed)
    paged = read_csv(simulated(tmp_path / "paged", 6.0, 0) / "steps.csv")
    assert (paged["mapped_pages"] == 0).all() and (paged["unmapped_pages"] == 0).all()


@pytest.mark.parametrize("ahead", [False, True])
def test_a_coalesced_vmm_segment_pays_the_page_maps_its_steps_one_by_one_would(ahead):
    """Pages a decode segment maps as it grows are charged at the step that maps them, so
    skipping identical steps changes no time; `ahead`: grown before the segment runs, as the
    real runner does (`allocates_ahead`), with the same charges. Small pages (2.5 tokens) and
    a tight budget make sequences cross pages within segments and reclaim idle ones."""
    from fractions import Fraction

    from engines import EngineOptions
    from kvbench.engine import Engine
    from workloads.presets import make_trace

    cost = CostModel(0.02, 1e-4, 5e-7, per_map_page_s=3e-4, per_unmap_page_s=1e-4)
    trace = make_trace("sharegpt-paper", 60, rate=4.0, seed=11)
    options = EngineOptions(
        num_slots=5000, max_len=2048, page_tokens=Fraction(5, 2), num_pages=2000, driver_pages=80
    )
    runs = []
    for coalesce, runner_ahead, charged in ((False, False, cost), (True, ahead, cost), (True, ahead, replace(
        cost, per_map_page_s=0.0, per_unmap_page_s=0.0
    ))):  # fmt: skip
        runner = CostModelRunner(charged)
        runner.allocates_ahead = runner_ahead  # the real runner's order: grow, then run
        runs.append(Engine(get_engine("vmm").build(options), runner, coalesce=coalesce).run(trace))
    slow, fast, free = runs
    assert len(fast.steps) < len(slow.steps)  # it did skip
    finish = [s.finish_s for s in slow.sequences]
    assert [s.finish_s for s in fast.sequences] == pytest.approx(finish, rel=1e-9)
    assert fast.busy.seconds == pytest.approx(slow.busy.seconds, rel=1e-9)
    assert fast.busy.seconds > free.busy.seconds + 80 * 3e-4  # maps were charged


@pytest.mark.parametrize("windows", [(), ((5, 0.5),), ((3, 0.25), (40, 0.25))])
def test_attention_pairs_count_what_each_query_sees(windows):
    """`KvReads.pairs` against a count query by query: a row feeding t tokens that end at c
    positions, its query at position p seeing p + 1 keys in a full layer and min(p + 1, W) in a
    window-W layer, each group weighted by its share; a decode step has none."""
    from engines.scheduler import Batch
    from kvbench.cost_model import KvReads

    rows = [(0, 1), (0, 37), (12, 1), (30, 9), (2, 64)]  # (computed before the step, fed)
    seqs = []
    for index, (done, fed) in enumerate(rows):
        seq = sequence_for(Request(index, 0.0, done + fed, 4))
        seq.num_computed = done
        seqs.append(seq)
    batch = Batch(tuple(seqs), True, sum(fed for _, fed in rows), 0, 1)
    full = 1.0 - sum(share for _, share in windows)
    expected = 0.0
    for done, fed in rows:
        for position in range(done, done + fed):
            expected += full * (position + 1)
            expected += sum(share * min(position + 1, window) for window, share in windows)
    reads = KvReads(windows)
    assert reads.pairs(batch) == pytest.approx(expected, rel=1e-12)
    assert reads.pairs(Batch(tuple(seqs), False, len(seqs), 0, 1)) == 0.0


def test_the_fit_recovers_a_known_attention_pair_price_and_steps_record_the_pairs(tmp_path):
    """Runs simulated with a price per query-key pair (prompts of 100-6,000 tokens, whole and in
    2,048-token chunks) record each prefill row's pairs and give the price back; read without
    the column, the fit cannot match them (a long prompt's tokens cost more than a short one's)."""
    import pandas as pd

    from kvbench.calibrate.fit import FITTED, read_rows, shape_lines

    price = dict(cost_per_attention_pair_s=2e-9)
    model = tmp_path / "true.json"
    model.write_text(json.dumps({"model": "llama-3.1-8b", "fixed_s": 0.004, "per_token_s": 3e-5,
                                 "per_kv_token_s": 2e-7, "per_prefill_token_s": 1e-5,
                                 "per_attention_pair_s": price["cost_per_attention_pair_s"]}))  # fmt: skip
    runs = []
    for chunked in (False, True):
        workload = WorkloadSpec("uniform:prompt=100..6000,output=4..40", num_requests=60, rate=4.0, seed=1)
        config = RunConfig(engine="paged", model="llama-3.1-8b", workload=workload, kv_cache_gib=2.0,
                           cost_model=str(model), chunked_prefill=chunked, max_num_seqs=16)  # fmt: skip
        out = tmp_path / f"chunked-{chunked}"
        write_result(simulate(config), out)
        runs.append(out)
    steps = pd.read_csv(runs[0] / "steps.csv")
    prefill = steps[steps.kind == "prefill"]
    assert (prefill.attention_pairs > 0).all() and (steps[steps.kind == "decode"].attention_pairs == 0).all()
    fitted = calibrate(runs, simulated_ok=True)
    assert fitted.cost.per_attention_pair_s == pytest.approx(2e-9, rel=1e-6)
    assert fitted.p90_relative_error < 1e-6
    assert "prefill attention: 2.000 ns a query-key pair" in shape_lines(fitted)
    rows = [read_rows(run, simulated_ok=True) for run in runs]
    counts = np.concatenate([r.counts for r in rows])
    durations = np.concatenate([r.durations for r in rows])
    without = np.delete(counts, FITTED.index("per_attention_pair_s"), axis=1)  # [R, terms - 1]
    constants = fit(without, durations)
    assert np.quantile(np.abs(without @ constants / durations - 1), 0.9) > 0.01
