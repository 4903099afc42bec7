"""External engines (transformers' generate and continuous batching) against kvbench's, on the CPU."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvbench.config import RunConfig, prepare  # noqa: E402
from kvbench.errors import KvbenchError  # noqa: E402
from kvbench.external.hf_cb import CbApi, cb_api  # noqa: E402
from kvbench.external.hf_weights import copy_into_hf, hf_config, hf_model_from_preset  # noqa: E402
from kvbench.external.observed import Observed, integrals  # noqa: E402
from kvbench.external.options import base_attention  # noqa: E402
from kvbench.modeling.arena import KVArena  # noqa: E402
from kvbench.modeling.attention import AttentionMetadata  # noqa: E402
from kvbench.modeling.weights import random_model  # noqa: E402
from kvbench.models import get_model  # noqa: E402
from kvbench.real.run import run_real  # noqa: E402
from kvbench.requests import Request  # noqa: E402
from kvbench.results.load import load_run  # noqa: E402
from kvbench.simulate import write_result  # noqa: E402
from workloads.spec import WorkloadSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
# staggered arrivals (Poisson, 40 req/s) of short requests
WORKLOAD = WorkloadSpec(source="uniform:prompt=3..20,output=1..12", num_requests=8, rate=40.0, seed=2)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """transformers' loop runs on its own thread; two busy test workers on two cores with torch's
    default threads make every step wait for a core (0.3 s steps instead of 5 ms)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(engine: str, model: str = "tiny-llama", **options) -> RunConfig:
    return RunConfig(
        engine=engine, model=model, workload=WORKLOAD, device="cpu", kv_cache_gib=0.005, weights_seed=3,
        block_size=4, hf_batch_size=3, hf_block_size=16, **options,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs():
    """Runs made once per (engine, model), on first use. kvbench's own engines attend through the
    PyTorch reference, as `auto` picks on a CPU outside the suite: here they are the tokens the
    external engines must match, and the Triton kernels (interpreted, 10x slower) give the
    reference's tokens in their own tests (`test_modeling`)."""
    made = {}

    def get(engine: str, model: str = "tiny-llama"):
        if (engine, model) not in made:
            options = {} if engine.startswith("hf-") else {"attention": "torch"}
            made[engine, model] = run_real(config(engine, model, **options))
        return made[engine, model]

    return get


def output_ids(result) -> list[list[int]]:
    return [list(seq.output_ids) for seq in result.run.sequences]


# ---------------------------------------------------------------- weights
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
def test_transformers_model_holds_kvbench_weights(name):
    """The converted model's logits are kvbench's (packed qkv / gate-up split back)."""
    spec = get_model(name)
    hf = hf_model_from_preset(spec, torch.float32, CPU, 3, "sdpa")
    ours = random_model(spec, torch.float32, CPU, 3)
    ids = torch.randint(0, spec.vocab, (11,), generator=torch.Generator().manual_seed(0))
    meta = AttentionMetadata(
        True, torch.arange(11), torch.tensor([0, 11]), torch.tensor([11], dtype=torch.int32), max_new=11,
        backend="torch", starts=torch.tensor([0]),
    )  # fmt: skip
    with torch.no_grad():
        expected = ours(ids, torch.arange(11), meta, KVArena(spec, 16, torch.float32, CPU))[0]
        got = hf(ids[None]).logits[0, -1]
    assert (got - expected).abs().max() < 1e-5
    assert hf.config.eos_token_id is None and hf.generation_config.eos_token_id is None


def test_conversion_refuses_to_leave_parameters_unset():
    spec = get_model("tiny-llama")
    bigger = transformers.LlamaForCausalLM(hf_config(replace(spec, num_layers=3)))
    with pytest.raises(RuntimeError, match="unset: model.layers.2"):
        copy_into_hf(random_model(spec, torch.float32, CPU), bigger)


# ---------------------------------------------------------------- same work, same tokens
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-opt"])
def test_hf_generate_gives_the_paged_engine_greedy_tokens(runs, model):
    paged, hf = runs("paged", model), runs("hf-generate", model)
    for seq in hf.run.sequences:
        assert len(seq.output_ids) == seq.request.output_len
    assert output_ids(hf) == output_ids(paged)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-opt"])
def test_hf_cb_gives_the_paged_engine_greedy_tokens(runs, model):
    """On every tested transformers (5.17 to 5.24: pyproject's dev extra); from 5.24 OPT's forward
    asks the paged cache for a length it has no method for (`hf_cb._cache_length_hook`)."""
    hf = runs("hf-cb", model)
    for seq in hf.run.sequences:
        assert len(seq.output_ids) == seq.request.output_len
    assert output_ids(hf) == output_ids(runs("paged", model))


def test_sampled_runs_finish_every_request_with_its_length():
    for engine in ("hf-generate", "hf-cb"):
        result = run_real(config(engine, temperature=0.9))
        assert [len(s.output_ids) for s in result.run.sequences] == [
            s.request.output_len for s in result.run.sequences
        ]
        assert result.summary["completed"] == len(result.run.sequences)


def test_checkpoint_folder_runs_the_same_weights(tmp_path):
    """`from_pretrained` (offline, no remote code) against kvbench's own checkpoint loader."""
    torch.manual_seed(0)
    spec = get_model("tiny-llama")
    transformers.LlamaForCausalLM(hf_config(spec)).save_pretrained(tmp_path / "ckpt")
    folder = str(tmp_path / "ckpt")
    paged, hf = run_real(config("paged", folder)), run_real(config("hf-generate", folder))
    assert output_ids(hf) == output_ids(paged)


# ---------------------------------------------------------------- timing and results
def test_hf_generate_batches_in_arrival_order_and_times_each_token(runs):
    records = runs("hf-generate").requests
    batches = [records[i : i + 3] for i in range(0, len(records), 3)]
    previous_end = 0.0
    for batch in batches:
        start = batch[0].admitted_s
        assert all(r.admitted_s == start for r in batch)
        assert start >= max(r.arrival_s for r in batch) and start >= previous_end
        assert len({r.first_token_s for r in batch}) == 1  # the prefill step's end
        for r in batch:  # its own last token, not the batch's end
            assert r.first_token_s <= r.finish_s and (r.output_len > 1) == (r.finish_s > r.first_token_s)
        previous_end = max(r.finish_s for r in batch)
    longest = max(batches[0], key=lambda r: r.output_len)
    shorter = [r for r in batches[0] if r.output_len < longest.output_len]
    assert all(r.finish_s < longest.finish_s for r in shorter)


def test_results_mark_external_and_leave_occupancy_absent(runs, tmp_path):
    for engine in ("hf-generate", "hf-cb"):
        write_result(runs(engine), tmp_path / engine)
        summary = json.loads((tmp_path / engine / "summary.json").read_text())
        assert summary["engine"] == engine and summary["mode"] == "real" and summary["external"] is True
        assert summary["occupancy"] == {} and summary["occupancy_saturated"] == {}
        assert summary["completed"] == 8 and summary["output_token_throughput"] > 0
        assert summary["mean_ttft_s"] > 0 and summary["mean_tpot_s"] > 0 and summary["transformers_version"]
        assert 1 <= summary["mean_batched_requests"] <= summary["peak_batched_requests"]
        config_json = json.loads((tmp_path / engine / "config.json").read_text())
        assert config_json["hf_attn"] == "paged|sdpa" and config_json["hf_batch_size"] == 3
        with open(tmp_path / engine / "requests.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["output_len"]) for r in rows] == [
            s.request.output_len for s in runs(engine).run.sequences
        ]
        steps = (tmp_path / engine / "steps.csv").read_text().splitlines()
        if engine == "hf-generate":  # one row per forward pass; occupancy cells empty
            assert summary["num_slots"] is None and summary["kv_budget_bytes"] is None
            assert len(steps) - 1 == summary["num_steps"] and steps[1].endswith(",,,,,,")
        else:  # transformers' steps and preemptions are not observed
            assert summary["num_slots"] == summary["hf_num_blocks"] * 16 and summary["num_steps"] is None
            assert summary["num_preemptions"] is None and {r["num_preemptions"] for r in rows} == {""}
            assert len(steps) == 1
        # what it does not observe (null counts, empty columns) loads as kvbench wrote it
        loaded = load_run(tmp_path / engine)
        assert loaded.summary == summary and len(loaded.requests) == 8 and len(loaded.steps) == len(steps) - 1


def test_busy_and_waiting_time_from_observed_requests():
    """Two requests: A arrives at 0, runs [1, 3); B arrives at 2, waits until 3, runs [3, 4)."""

    def observed(rid, arrival, admitted, held):
        return Observed(Request(rid, arrival, 4, 2), admitted, held, np.array([held, held]), [0, 0])

    busy, saturated, peak = integrals([observed(0, 0.0, 1.0, 3.0), observed(1, 2.0, 3.0, 4.0)])
    assert (busy.seconds, busy.running_seconds) == (3.0, 3.0)
    assert (saturated.seconds, saturated.running_seconds) == (1.0, 1.0)
    assert peak == 1


# ---------------------------------------------------------------- versions and bad input
def test_missing_continuous_batching_api_is_one_line():
    with pytest.raises(KvbenchError, match=r"needs transformers >= 5\.17.*4\.40\.0 has no continuous"):
        cb_api(SimpleNamespace(__version__="4.40.0"))

    class Manager:  # an add_request without per-request lengths or timestamps
        def add_request(self, input_ids, request_id=None): ...

        get_result = start = stop = add_request

    mixin = SimpleNamespace(init_continuous_batching=lambda: None)
    old = SimpleNamespace(
        __version__="5.0.0", ContinuousBatchingManager=Manager, ContinuousMixin=mixin,
        generation=SimpleNamespace(ContinuousBatchingConfig=object),
    )  # fmt: skip
    with pytest.raises(KvbenchError, match="add_request takes no max_new_tokens, record_timestamps"):
        cb_api(old)
    api = cb_api(transformers)  # the installed one has everything
    assert api.block_field in ("page_size", "block_size") and api.default_block_size() >= 4


def test_attention_names():
    assert base_attention("paged|sdpa") == base_attention("sdpa") == "sdpa"
    assert base_attention("paged|flash_attention_2") == "flash_attention_2"
    with pytest.raises(KvbenchError, match="unknown --hf-attn 'flex'"):
        base_attention("flex")
    new, old = CbApi(object, "page_size", True, "5.24"), CbApi(object, "block_size", False, "5.17")
    assert (new.attention("sdpa"), new.attention("eager")) == ("sdpa", "paged|eager")
    assert (old.attention("sdpa"), old.attention("flash_attention_2")) == (
        "paged|sdpa",
        "paged|flash_attention_2",
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"hf_batch_size": 0}, "--hf-batch-size must be a positive integer up to 2147483647, got 0"),
        ({"hf_block_size": 2}, "--hf-block-size must be an integer in 4..2147483647, got 2"),
        ({"hf_memory": 1.5}, "--hf-memory must be a finite number in (0, 1], got 1.5"),
        ({"hf_attn": "paged|flex"}, "unknown --hf-attn 'paged|flex'"),
    ],
)
def test_bad_options_are_refused_before_any_work(options, message):
    with pytest.raises(KvbenchError) as error:
        prepare(RunConfig(engine="hf-cb", model="tiny-llama", workload=WORKLOAD, **options))
    assert message in str(error.value) and "\n" not in str(error.value)


def kvbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (("simulate", "--engine", "hf-generate"), "--engine hf-generate: external engines only run for real"),
        (("run", "--engine", "hf-cb", "--device", "cpu", "--hf-attn", "flex"), "unknown --hf-attn 'flex'"),
        (
            ("run", "--engine", "hf-generate", "--device", "cpu", "--hf-batch-size", "-1"),
            "--hf-batch-size must",
        ),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, args, message):
    proc = kvbench(*args, "--model", "tiny-llama", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
