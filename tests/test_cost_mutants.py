"""Rules of the step pricing (`kvbench.cost_model`) and the KV budget (`kvbench.budget`) that a
mutation run of those modules found unpinned: the terms only the first step of a segment pays
(a prefill's own per-token price and per-step cost, copies, a decode segment's host cost), the
knee charged only past it, every window group's skipped K/V (a model with two window sizes), the
roofline's swap and copy prices, and, for the budget, its edges (one slot, exactly the slot
limit, a utilization of exactly 1, pools for one-token sequences), every refusal's whole line,
the emulated budget's `source` (measured weights and activations, several GPUs), and the check of
an arena against the host's memory.

Cost models use binary fractions (1, 0.5, 0.25, ...) so that every step time is exact
arithmetic, compared with `==`; budgets are whole GiB or exact multiples of a slot's bytes.
docs/MUTATION.md says why such tests exist; the mutants they kill, and those that are
equivalent, are in results/mutation/cost/.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch

from engines.batch import Batch
from kvbench.budget import (
    GIB,
    GPUS,
    MAX_SLOTS,
    KVBudget,
    budget_by_layer_kind,
    budget_emulating,
    budget_from_gib,
    check_device_memory,
    get_gpu,
    host_available_bytes,
)
from kvbench.cost_model import CostModel, CostModelRunner, KvReads
from kvbench.errors import KvbenchError
from kvbench.models import get_model
from kvbench.requests import Request
from kvbench.sequence import Sequence

# ---------------------------------------------------------------- step pricing


def prompt(length: int, request_id: int = 0) -> Sequence:
    """A sequence whose whole prompt a prefill step computes (nothing computed yet)."""
    seq = Sequence(Request(request_id, 0.0, length, 50))
    seq.num_tokens = length
    return seq


def decoding(length: int, request_id: int = 0) -> Sequence:
    """A sequence just prefilled: `length` + 1 tokens known, `length` computed."""
    seq = Sequence(Request(request_id, 0.0, length, 50))
    seq.advance(1, end_s=0.0)
    return seq


def decode_batch(*lengths: int, **extra) -> Batch:
    seqs = tuple(decoding(n, i) for i, n in enumerate(lengths))
    context = sum(seq.num_tokens for seq in seqs)
    return Batch(
        seqs, is_prefill=False, num_tokens=len(seqs), num_context=context, steps_to_finish=49, **extra
    )


def steps(cost: CostModel, batch: Batch, k: int, reads: KvReads | None = None) -> list[float]:
    return CostModelRunner(cost, reads).run(batch, k, 0.0, math.inf).durations.tolist()


def test_a_prefill_step_pays_its_own_token_price_and_per_step_cost_but_no_knee_or_segment_cost():
    """A prefill step costs fixed + per_prefill_token_s x tokens + per_kv_token_s x context +
    per_prefill_s, with `per_prefill_token_s` (not the decode rows' `per_token_s`) on its tokens;
    the knee and the per-segment host cost are decode terms it never pays. Prompts of 4 and 8:
    1 + 0.125 x 12 + 0.25 x 12 + 8 = 13.5."""
    cost = CostModel(
        fixed_s=1.0,
        per_token_s=0.5,
        per_kv_token_s=0.25,
        per_prefill_s=8.0,
        per_prefill_token_s=0.125,
        per_segment_s=16.0,
        knee_batch=0,
        per_row_above_knee_s=32.0,
    )
    batch = Batch((prompt(4), prompt(8, 1)), is_prefill=True, num_tokens=12, num_context=12)
    assert steps(cost, batch, 1) == [13.5]
    # without `per_prefill_token_s` a prefill token costs what a decode row does: 1 + 0.5 x 12 + 3 + 8
    assert steps(replace(cost, per_prefill_token_s=None), batch, 1) == [18.0]


def test_a_decode_segment_pays_its_host_cost_once_on_its_first_step():
    """`per_segment_s` is added to a decode segment's first step only. Rows of context 4 and 6:
    step j costs 1 + 0.5 x 2 + 0.25 x (10 + 2j), plus 2 on step 0."""
    cost = CostModel(fixed_s=1.0, per_token_s=0.5, per_kv_token_s=0.25, per_segment_s=2.0)
    assert steps(cost, decode_batch(3, 5), 3) == [6.5, 5.0, 5.5]


def test_the_knee_charges_only_the_rows_past_it_on_every_decode_step():
    """A decode step of r rows costs `per_row_above_knee_s` x max(r - knee_batch, 0) more: nothing
    at or below the knee (2 rows, knee 2), one row's worth at 3 rows, on every step of the
    segment. Rows of context 4 (and 6, 8): 1 + 0.5 r + 0.25 x context, + 4 per row past 2."""
    cost = CostModel(
        fixed_s=1.0, per_token_s=0.5, per_kv_token_s=0.25, knee_batch=2, per_row_above_knee_s=4.0
    )
    assert cost.above_knee(1) == cost.above_knee(2) == 0.0 and cost.above_knee(3) == 4.0
    assert steps(cost, decode_batch(3, 5), 2) == [4.5, 5.0]  # contexts 10, 12: no knee
    assert steps(cost, decode_batch(3, 5, 7), 2) == [11.0, 11.75]  # contexts 18, 21: + 4 each


def test_the_first_step_pays_the_copies_and_swaps_scheduled_with_it():
    """Copies inside the arena (`per_copy_slot_s` per slot copied) and swaps (`per_swap_block_s`
    per block) are added to step 0, never subtracted, and only to it. Two rows of context 4 and
    6: 1 + 0.5 x 2 + 0.25 x 10 = 4.5, + 0.5 x 3 slots + 0.25 x 2 blocks on step 0."""
    cost = CostModel(
        fixed_s=1.0, per_token_s=0.5, per_kv_token_s=0.25, per_swap_block_s=0.25, per_copy_slot_s=0.5
    )
    batch = decode_batch(3, 5, copied_slots=3, swaps=((False, 0, 1), (False, 2, 3)))
    assert steps(cost, batch, 2) == [6.5, 5.0]


def test_every_window_group_skips_what_lies_outside_its_own_window():
    """A model with two window groups (W = 2 with a quarter of a slot's bytes, W = 4 with half of
    them; the full layers the last quarter): a row of context c reads 0.25 c + 0.25 min(c, 2) +
    0.5 min(c, 4) slots. A row of context 10 at 1 s per slot: 5, then 5.25 and 5.5 as it grows.
    Pricing only one of the groups' skips gives 7, or 7.5 and 8 on the later steps."""
    reads = KvReads(((2, 0.25), (4, 0.5)))
    cost = CostModel(fixed_s=0.0, per_token_s=0.0, per_kv_token_s=1.0)
    batch = decode_batch(9)
    assert reads.skipped(batch, 3).tolist() == [5.0, 5.75, 6.5]
    assert steps(cost, batch, 3, reads) == [5.0, 5.25, 5.5]
    assert steps(cost, batch, 1, reads) == [5.0]


def test_the_roofline_prices_a_swapped_block_and_a_copied_slot_from_their_bytes():
    """OPT-13B (819,200 bytes a slot) on an A100-40GB: a swapped block of the default 16 slots
    costs 10 us + 16 x 819,200 B / 25 GB/s = 534.288 us (32 slots: 1,058.576 us); a slot copied
    inside the arena is read and written once at 0.8 x 1.555 TB/s: 2 x 819,200 / 1.244e12 s."""
    model, gpu = get_model("opt-13b"), GPUS["a100-40gb"]
    cost = CostModel.roofline(model, gpu)
    assert math.isclose(cost.per_swap_block_s, 534.288e-6, rel_tol=1e-12)
    assert math.isclose(
        CostModel.roofline(model, gpu, block_size=32).per_swap_block_s, 1058.576e-6, rel_tol=1e-12
    )
    assert math.isclose(cost.per_copy_slot_s, 1_638_400 / 1.244e12, rel_tol=1e-12)
    assert math.isclose(cost.per_copy_slot_s, 1.3170418006430868e-06, rel_tol=1e-12)


# ---------------------------------------------------------------- the budget

TINY = get_model("tiny-opt")  # 2 layers x K and V x 4 heads x 16 x 2 bytes: 512 bytes a slot


def test_one_slot_is_a_budget_and_a_byte_less_is_refused_naming_the_flag():
    """A budget of exactly one slot's bytes is taken (1 slot); one byte less is refused, the line
    naming the flag, the GiB it leaves and the slot's bytes."""
    assert TINY.kv_bytes_per_token == 512
    one = budget_from_gib(512 / GIB, TINY)
    assert (one.budget_bytes, one.num_slots) == (512, 1)
    message = (
        "--kv-cache-gib leaves 4.76e-07 GiB for the KV cache of tiny-opt, less than one token (512 bytes)"
    )
    with pytest.raises(KvbenchError) as refused:
        budget_from_gib(511 / GIB, TINY)
    assert str(refused.value) == message


@pytest.mark.parametrize("gib", [0, -1, math.inf, math.nan])
def test_a_kv_cache_gib_that_is_not_a_positive_number_is_refused_as_such(gib):
    """0, negative, infinite and NaN sizes are refused by the one rule they break, not by what
    a budget of that size would leave."""
    with pytest.raises(KvbenchError) as refused:
        budget_from_gib(gib, TINY)
    assert str(refused.value) == f"--kv-cache-gib must be a positive number, got {gib}"


def test_the_slot_limit_itself_is_a_budget_and_one_more_slot_is_refused_with_the_count():
    """`MAX_SLOTS` (2**24) slots are taken; one more is refused, the count written with commas;
    a count of 10**12 or more (a typo's) in exponent form."""
    assert budget_from_gib(MAX_SLOTS * 512 / GIB, TINY).num_slots == MAX_SLOTS == 16_777_216
    tail = "more than kvbench's limit of 16,777,216 (kvbench.budget.MAX_SLOTS); give a smaller --kv-cache-gib"
    for slots, count in [
        (MAX_SLOTS + 1, "16,777,217"),
        (10**12, "1.00e+12"),
        (10**12 - 1, "999,999,999,999"),
    ]:
        with pytest.raises(KvbenchError) as refused:
            budget_from_gib(slots * 512 / GIB, TINY)
        assert str(refused.value) == f"--kv-cache-gib gives tiny-opt {count} token slots, {tail}", slots


def test_a_model_with_no_kv_bytes_is_blamed_whole():
    """A model of 0 bytes of K/V a token (no layers) is refused naming the model, not divided by."""
    broken = replace(TINY, num_layers=0)
    with pytest.raises(KvbenchError) as refused:
        budget_from_gib(1.0, broken)
    assert str(refused.value) == (
        "--model tiny-opt: 0 bytes of K/V per token; its layers, KV heads and head size must be positive"
    )


def test_an_unknown_gpu_is_refused_naming_every_known_one():
    assert get_gpu("h200-141gb") is GPUS["h200-141gb"]
    with pytest.raises(KvbenchError) as refused:
        get_gpu("a100")
    assert str(refused.value) == (
        "unknown --emulate-gpu 'a100'; choose one of: a100-40gb, a100-80gb, h100-80gb, h200-141gb"
    )


def test_an_emulated_budget_on_two_gpus_subtracts_measured_weights_and_each_gpus_activations():
    """budget = gpus x memory x utilization - weights - gpus x reserve: OPT-13B on 2 x A100-40GB
    at 0.5, weights measured at 4 GiB, activations at 1 GiB a GPU: 40 - 4 - 2 = 34 GiB, 34 x
    1,310.72 = 44,564.48 -> 44,564 slots; the source names both GPUs and both measurements."""
    budget = budget_emulating(
        GPUS["a100-40gb"],
        get_model("opt-13b"),
        utilization=0.5,
        weight_bytes=4 * GIB,
        activation_bytes=GIB,
        gpus=2,
    )
    assert (budget.budget_bytes, budget.num_slots) == (34 * GIB, 44_564)
    assert budget.source == (
        "--emulate-gpu a100-40gb: 2 x 40.0 GiB x 0.5 - weights 4.00 GiB (measured) "
        "- activations 2 x 1.00 GiB (measured)"
    )


def test_a_utilization_of_exactly_one_is_taken_and_outside_zero_to_one_is_refused():
    """(0, 1]: at 1 the whole memory counts (40 - 8 - 1 = 31 GiB, 40,632 slots of OPT-13B);
    0 and 1.5 are refused by that rule, not by what they would leave."""
    opt13b, a100 = get_model("opt-13b"), GPUS["a100-40gb"]
    whole = budget_emulating(a100, opt13b, utilization=1.0, weight_bytes=8 * GIB, activation_bytes=GIB)
    assert (whole.budget_bytes, whole.num_slots) == (31 * GIB, 40_632)
    assert whole.source == (
        "--emulate-gpu a100-40gb: 40.0 GiB x 1.0 - weights 8.00 GiB (measured) "
        "- activations 1.00 GiB (measured)"
    )
    for utilization in (0.0, 1.5):
        with pytest.raises(KvbenchError) as refused:
            budget_emulating(a100, opt13b, utilization=utilization)
        assert str(refused.value) == f"--gpu-memory-utilization must be in (0, 1], got {utilization}"


def test_the_estimated_and_the_published_budgets_say_how_they_were_reached():
    """OPT-13B on an A100-40GB: weights 25,706,946,560 B (23.94 GiB, fp16), the activation reserve
    2,048 x (5 x 5,120 + 20,480) x 2 + 256 x 50,272 x 4 = 240,222,208 B (0.22 GiB, estimated). At
    0.85 that is the budget's source; at the default 0.9 the paper's 12 GiB is taken, the
    estimate (36 - 23.94 - 0.22 = 11.83 GiB) and its terms beside it."""
    opt13b, a100 = get_model("opt-13b"), GPUS["a100-40gb"]
    terms = "- weights 23.94 GiB (fp16) - activations 0.22 GiB (estimated)"
    assert (
        budget_emulating(a100, opt13b, utilization=0.85).source
        == f"--emulate-gpu a100-40gb: 40.0 GiB x 0.85 {terms}"
    )
    assert budget_emulating(a100, opt13b).source == (
        "--emulate-gpu a100-40gb: 12 GiB, the PagedAttention paper's KV cache for opt-13b on a100-40gb "
        f"(its Table 1); kvbench's own estimate: 11.83 GiB (40.0 GiB x 0.9 {terms})"
    )


def test_pools_can_be_sized_for_one_token_sequences():
    """A sequence length of 1 is a length: OPT-13B's 12 GiB is one pool of 15,728 slots, 15,728
    one-token sequences either way."""
    split = budget_by_layer_kind(budget_from_gib(12, get_model("opt-13b")), get_model("opt-13b"), 1)
    assert split.one_pool_sequences == split.pooled_sequences == 15_728


def test_the_host_memory_is_read_in_bytes_from_meminfo():
    """MemAvailable (kB in /proc/meminfo) in bytes: a positive multiple of 1,024."""
    available = host_available_bytes()
    assert available is not None and available > 0 and available % 1024 == 0


@pytest.mark.parametrize("ranks", [1, 2])
def test_an_arena_beyond_the_hosts_memory_is_refused_naming_each_ranks_share(ranks):
    """A petabyte a rank (10**15 B = 9.31e+05 GiB) is more than any host has: refused on the CPU,
    naming the share each rank would hold and the memory the host has (in GiB, a plausible
    number); a mebibyte is taken."""
    cpu = torch.device("cpu")
    with pytest.raises(KvbenchError) as refused:
        check_device_memory(KVBudget(ranks * 10**15, 1, "--kv-cache-gib huge"), cpu, ranks)
    line = str(refused.value)
    found = re.fullmatch(
        r"the KV budget \(--kv-cache-gib huge\) needs 9\.31e\+05 GiB but the host has (\S+) GiB available; "
        r"lower --kv-cache-gib",
        line,
    )
    assert found, line
    assert 0 < float(found.group(1)) < 10**5, line  # GiB, not bytes
    check_device_memory(KVBudget(1 << 20, 1, "--kv-cache-gib small"), cpu, ranks)
    if ranks == 1:  # the default is one rank: the whole budget on this device
        with pytest.raises(KvbenchError, match=r"needs 9\.31e\+05 GiB"):
            check_device_memory(KVBudget(10**15, 1, "--kv-cache-gib huge"), cpu)
