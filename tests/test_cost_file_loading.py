"""What `load_cost_model` takes from a `kvbench calibrate` file, and what it refuses.

A cost file prices every simulated step: a constant dropped on the way in (read as 0), a bad value
let through (a negative or NaN cost gives latencies that look like results), or a file of another
model applied to this one would give a wrong simulation with nothing to say so. Each test writes
the file by hand, so the rule it pins holds for any file a user passes with --cost-model, not
only for the ones `kvbench calibrate` writes. Self-contained (no committed results read): the
mutation run's selection for kvbench/calibrate/fit.py includes it.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import pytest

from kvbench.calibrate.fit import load_cost_model
from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError

REQUIRED = ("fixed_s", "per_token_s", "per_kv_token_s")
OPTIONAL = ("per_swap_block_s", "per_copy_slot_s", "per_prefill_s", "per_prefill_token_s", "per_map_page_s",
            "per_unmap_page_s", "per_row_above_knee_s", "per_segment_s", "per_attention_pair_s",
            "routed_experts_s")  # fmt: skip
TERMS = REQUIRED + OPTIONAL


def _file(tmp_path, **data) -> str:
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"model": "opt-13b", "fixed_s": 0.008, "per_token_s": 1.5e-5,
                                "per_kv_token_s": 2e-7, **data}))  # fmt: skip
    return str(path)


def _refused(path: str, *words: str) -> str:
    with pytest.raises(KvbenchError) as error:
        load_cost_model(path, "opt-13b")
    message = str(error.value)
    assert message.startswith(f"--cost-model {path}: ") and "\n" not in message
    assert all(word in message for word in words), message
    return message


def test_the_loader_knows_every_cost_term_of_the_model():
    """A term added to CostModel and not to the loader would be read as its default from every file."""
    others = {"knee_batch", "pads_decode", "assumed", "expert_pick"}  # a batch, a flag, a list, a share
    assert set(TERMS) | others == {f.name for f in fields(CostModel)}


def test_every_term_is_taken_as_written(tmp_path):
    """Distinct values, one per term, land each in its own field: none dropped, none swapped."""
    values = {term: (i + 1) * 1e-6 for i, term in enumerate(TERMS)}
    others = {"knee_batch": 24, "pads_decode": True, "assumed": ["per_copy_slot_s"], "expert_pick": 0.25}
    path = _file(tmp_path, **values, **others)
    loaded = load_cost_model(path, "opt-13b")
    assert {term: getattr(loaded, term) for term in TERMS} == values
    assert (loaded.knee_batch, loaded.pads_decode, loaded.assumed) == (24, True, ("per_copy_slot_s",))
    assert loaded.expert_pick == 0.25
    assert all(isinstance(getattr(loaded, term), float) for term in TERMS)  # an int 0 is read as 0.0


def test_a_term_left_out_or_null_takes_the_models_default(tmp_path):
    bare = load_cost_model(_file(tmp_path), "opt-13b")
    assert bare == CostModel(0.008, 1.5e-5, 2e-7, assumed=bare.assumed)
    assert bare.per_prefill_token_s is None and bare.knee_batch is None and bare.pads_decode is False
    nulls = load_cost_model(_file(tmp_path, per_prefill_token_s=None, per_segment_s=None, knee_batch=None),
                            "opt-13b")  # fmt: skip
    assert nulls == bare
    assert load_cost_model(_file(tmp_path, fixed_s=0), "opt-13b").fixed_s == 0.0  # zero is a cost


@pytest.mark.parametrize("term", REQUIRED)
def test_a_file_without_a_required_term_is_not_a_cost_file(tmp_path, term):
    path = _file(tmp_path)
    data = json.loads(Path(path).read_text())
    del data[term]
    Path(path).write_text(json.dumps(data))
    _refused(path, "not a kvbench calibrate file", f"(no {term!r})")
    _refused(_file(tmp_path, **{term: None}), f"{term!r} must be a finite number >= 0, got null")


@pytest.mark.parametrize("term", TERMS)
@pytest.mark.parametrize("bad", [-1e-9, math.inf, math.nan, True, "0.01", [0.01]])
def test_a_cost_that_is_not_a_finite_number_at_least_zero_is_refused(tmp_path, term, bad):
    message = _refused(_file(tmp_path, **{term: bad}), f"{term!r} must be a finite number >= 0, got ")
    assert message.endswith(json.dumps(bad))


@pytest.mark.parametrize("term", TERMS)
def test_a_cost_over_an_hour_a_step_is_refused(tmp_path, term):
    """1e300 s a step is finite, but a run's latencies then overflow to inf (their variance
    squares them), and report refuses the summary.json the simulation wrote."""
    _refused(_file(tmp_path, **{term: 1e300}), f"{term!r} is 1e+300 s, over a step's most (3600 s)")
    pick = {"expert_pick": 0.5} if term == "routed_experts_s" else {}  # expert reads need a share read
    assert getattr(load_cost_model(_file(tmp_path, **{term: 3600}, **pick), "opt-13b"), term) == 3600.0


def test_a_file_of_another_model_or_of_none_is_refused(tmp_path):
    _refused(_file(tmp_path, model="llama-3.1-8b"), "fitted on llama-3.1-8b, not on --model opt-13b")
    path = _file(tmp_path)
    data = json.loads(Path(path).read_text())
    for model in (None, ""):
        data["model"] = model
        Path(path).write_text(json.dumps(data))
        assert "not on --model" not in _refused(path, "names no model")
    del data["model"]
    Path(path).write_text(json.dumps(data))
    _refused(path, "names no model")


@pytest.mark.parametrize("knee", [0, -8, 1.5, True, "8"])
def test_the_knee_is_a_whole_batch_of_one_or_more(tmp_path, knee):
    _refused(
        _file(tmp_path, knee_batch=knee), "'knee_batch' must be a whole number >= 1 or null", f"got {knee}"
    )


def test_a_knee_of_one_is_a_batch(tmp_path):
    assert load_cost_model(_file(tmp_path, knee_batch=1), "opt-13b").knee_batch == 1


@pytest.mark.parametrize("pads", [1, "true", None])
def test_pads_decode_is_true_or_false(tmp_path, pads):
    _refused(
        _file(tmp_path, pads_decode=pads), "'pads_decode' must be true or false", f"got {json.dumps(pads)}"
    )


def test_an_older_file_assumed_what_it_lacks_or_left_at_zero(tmp_path):
    """Before `assumed` existed, the swap, copy and page-map costs were never fitted: a file
    without the list assumed those it lacks or holds at 0, and no other term."""
    loaded = load_cost_model(
        _file(tmp_path, per_swap_block_s=5e-4, per_map_page_s=0, per_prefill_s=0), "opt-13b"
    )
    assert loaded.assumed == ("per_copy_slot_s", "per_map_page_s", "per_unmap_page_s")
    every = {
        "per_swap_block_s": 1e-4,
        "per_copy_slot_s": 1e-6,
        "per_map_page_s": 3e-5,
        "per_unmap_page_s": 2e-5,
    }
    assert load_cost_model(_file(tmp_path, **every), "opt-13b").assumed == ()


def test_a_written_assumed_list_is_taken_as_it_is(tmp_path):
    """A newer file's list stands even where a value is 0 (fitted to 0 is not assumed)."""
    loaded = load_cost_model(_file(tmp_path, per_swap_block_s=0, assumed=["per_map_page_s"]), "opt-13b")
    assert loaded.assumed == ("per_map_page_s",)
    assert load_cost_model(_file(tmp_path, assumed=[]), "opt-13b").assumed == ()


@pytest.mark.parametrize(
    "assumed",
    [["per_swap_block"], ["knee_batch"], ["assumed"], ["pads_decode"], "per_swap_block_s", {"x": 1}],
)
def test_assumed_names_only_cost_terms(tmp_path, assumed):
    message = _refused(
        _file(tmp_path, assumed=assumed), "'assumed' must be a list of cost terms (", "per_swap_block_s"
    )
    assert message.endswith(f"got {json.dumps(assumed)}")
    assert "knee_batch," not in message and "pads_decode" not in message.split("got")[0]


def test_a_folder_a_missing_file_or_unparsable_json_is_one_line_naming_the_flag_and_path(tmp_path):
    _refused(str(tmp_path), "is a folder, not a kvbench calibrate file")
    _refused(str(tmp_path / "none.json"), "cannot read it (no such file)")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": "opt-13b", "fixed_s": ')
    _refused(str(broken), "cannot read it (")


def test_the_assumed_error_lists_the_cost_terms_it_takes(tmp_path):
    message = _refused(_file(tmp_path, assumed=["nope"]), "'assumed' must be a list of cost terms (")
    assert "(fixed_s, per_attention_pair_s, per_copy_slot_s, per_kv_token_s, per_map_page_s," in message


def test_a_model_that_is_not_a_name_is_no_model(tmp_path):
    _refused(_file(tmp_path, model=13), "names no model")
    _refused(_file(tmp_path, model=["opt-13b"]), "names no model")


def test_the_digest_follows_the_model_and_every_priced_term_and_nothing_else(tmp_path):
    """Runs record the digest of the cost file they priced with, so a resumed sweep reruns a cell
    whose file changed: a change of model or of any term must change it; held-out errors written
    beside the fit, or a file that cannot be read, must not pass for a priced file."""
    from kvbench.calibrate.fit import cost_file_digest

    base = cost_file_digest(_file(tmp_path))
    assert base is not None and len(base) == 64
    assert cost_file_digest(_file(tmp_path, model="llama-3.1-8b")) != base
    for term in TERMS:
        assert cost_file_digest(_file(tmp_path, **{term: 7e-7})) != base, term
    assert cost_file_digest(_file(tmp_path, knee_batch=16)) != base
    # a term added after files were written: absent or 0, the file prices as it did
    zeros = {"per_segment_s": 0, "per_attention_pair_s": 0, "pads_decode": False, "routed_experts_s": 0,
             "expert_pick": 0}  # fmt: skip
    assert cost_file_digest(_file(tmp_path, **zeros)) == base
    assert cost_file_digest(_file(tmp_path, held_out=[{"error": 0.1}], rows=5)) == base
    assert cost_file_digest(str(tmp_path / "none.json")) is None
    (tmp_path / "list.json").write_text("[1, 2]")
    assert cost_file_digest(str(tmp_path / "list.json")) is None
    (tmp_path / "broken.json").write_text("{")
    assert cost_file_digest(str(tmp_path / "broken.json")) is None
