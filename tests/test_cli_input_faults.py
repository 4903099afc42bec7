"""Inputs that once crashed a command or ran it on a silently wrong value: each is now either
refused in one `error:` line naming the flag the user typed (exit code 2, nothing written) or,
where kvbench can repair what it finds in its own folder, handled and said.

Cases run through `kvbench.cli.app.main` in this process, as in test_bad_flags.py.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from tests.test_bad_flags import assert_one_error, kvbench

SWEEP = ("sweep", "--engines", "paged", "--model", "tiny-opt", "--kv-cache-gib", "0.002",
         "--trace", "fixed:prompt=4,output=4", "--num-requests", "5")  # fmt: skip


def _cell(out: Path, rate: str) -> Path:
    (folder,) = (out / "cells").glob(f"*__rate-{rate}__*")
    return folder


def _damage_summary(folder: Path, text: str) -> None:
    (folder / "summary.json").write_text(text, encoding="utf-8")


def _latency_text(folder: Path) -> None:
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    _damage_summary(folder, json.dumps({**summary, "normalized_latency_s": "x"}))


DAMAGES = {
    "empty summary": lambda folder: _damage_summary(folder, "{}"),
    "null summary": lambda folder: _damage_summary(folder, "null"),
    "latency as text": _latency_text,
    "truncated config": lambda folder: (folder / "config.json").write_text("{", encoding="utf-8"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=str)
def test_a_resumed_sweep_runs_a_damaged_cell_again(tmp_path, capsys, monkeypatch, damage):
    """A cell folder is kvbench's own: a damaged one is run again (and said), not a crash."""
    out = tmp_path / "sw"
    args = (*SWEEP, "--rates", "1,2", "--out", str(out))
    assert kvbench(capsys, monkeypatch, *args)[0] == 0
    DAMAGES[damage](_cell(out, "1"))
    code, stdout, err = kvbench(capsys, monkeypatch, *args, "--resume")
    assert code == 0, err
    assert "Traceback" not in stdout + err
    assert f"running {_cell(out, '1').name} again" in err
    assert "(1 run, 2 resumed, 0 failed)" in stdout
    summary = json.loads((_cell(out, "1") / "summary.json").read_text(encoding="utf-8"))
    assert isinstance(summary["normalized_latency_s"], float)


def test_a_damaged_cell_of_an_isolated_sweep_runs_again_in_its_own_process(tmp_path, capsys, monkeypatch):
    """--isolate runs a cell as `kvbench simulate --out <cell>`, which writes only into a folder
    holding no older run: the damaged cell's own files go first, what a user put there stays."""
    out = tmp_path / "sw"
    args = (*SWEEP, "--rates", "1,2", "--isolate", "--out", str(out))
    assert kvbench(capsys, monkeypatch, *args)[0] == 0
    _latency_text(_cell(out, "1"))
    code, stdout, err = kvbench(capsys, monkeypatch, *args, "--resume")
    assert code == 0, err
    assert "(1 run, 2 resumed, 0 failed)" in stdout
    summary = json.loads((_cell(out, "1") / "summary.json").read_text(encoding="utf-8"))
    assert isinstance(summary["normalized_latency_s"], float)


def test_a_cell_written_before_a_newer_summary_key_is_still_finished(tmp_path, capsys, monkeypatch):
    """A summary lacking a key kvbench added since (an older cell, hours of GPU time perhaps) is
    resumed as it is; only what the sweep reads of it (latency, throughput) must be there."""
    out = tmp_path / "sw"
    args = (*SWEEP, "--rates", "1,2", "--out", str(out))
    assert kvbench(capsys, monkeypatch, *args)[0] == 0
    path = _cell(out, "1") / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    del summary["std_ttft_s"], summary["peak_batched_requests"]
    _damage_summary(path.parent, json.dumps(summary))
    before = path.read_bytes()
    code, stdout, err = kvbench(capsys, monkeypatch, *args, "--resume")
    assert code == 0 and "again" not in err, err
    assert "(0 run, 3 resumed, 0 failed)" in stdout and path.read_bytes() == before


def test_a_kernel_cell_far_over_the_memory_cap_is_skipped_before_its_layout_is_drawn():
    """Its block table alone would be petabytes: drawing it raised MemoryError (and left the
    run's bandwidth.json behind) before the cell's size was compared with --max-gib."""
    import torch

    from kernels import bench

    cell = bench.Cell(
        batch=10**6, context=10**12, block_size=16, kv_heads=8, gqa=4, head_dim=128, dtype="float16"
    )
    config = bench.BenchConfig(cells=(cell,), backends=("kvbench-paged",), device="cpu", max_gib=64)
    context = bench.Context.create(torch.device("cpu"), config.backends)
    (row,) = bench.run_cell(cell, config, context, read_bw=1e9)
    assert row.status == "skipped" and "needs at least" in row.note and "--max-gib 64" in row.note


def test_a_kernel_size_of_thousands_of_digits_is_one_line(tmp_path, capsys, monkeypatch):
    """`int` refuses a string of more than 4300 digits with its own ValueError."""
    out = tmp_path / "k"
    done = kvbench(capsys, monkeypatch, "kernels", "--batch", "1" + "0" * 5000, "--out", str(out))
    assert_one_error(*done, "--batch")
    assert not out.exists()


def test_an_hf_memory_fraction_too_small_for_one_block_is_one_line(tmp_path, capsys, monkeypatch):
    """transformers sizes its cache from the memory it finds free and refuses a fraction that
    leaves no block with its own ValueError; the line names the flag, and nothing is written."""
    pytest.importorskip("transformers")
    out = tmp_path / "h"
    done = kvbench(
        capsys, monkeypatch, "run", "--engine", "hf-cb", "--model", "tiny-opt", "--num-requests", "3",
        "--trace", "fixed:prompt=16,output=4", "--arrivals", "all", "--kv-cache-gib", "0.01",
        "--device", "cpu", "--hf-memory", "1e-9", "--out", str(out),
    )  # fmt: skip
    assert_one_error(*done, "--hf-memory 1e-09")
    assert not out.exists()


SIZES = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 2048,
         "intermediate_size": 128, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": False}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (json.dumps({**SIZES, "intermediate_size": 10**300}), "intermediate_size is over 2147483647"),
        (json.dumps({**SIZES, "vocab_size": 2**31}), "vocab_size is over 2147483647"),
        (json.dumps(SIZES).replace("1000", "1" + "0" * 5000), "an integer too long to read"),
    ],
    ids=["1e300", "2**31", "5001 digits"],
)
def test_a_config_json_size_beyond_any_model_is_one_line(tmp_path, capsys, monkeypatch, text, says):
    """Such sizes once simulated to latencies of inf (or hit Python's limit on integer digits)."""
    model, out = tmp_path / "model", tmp_path / "o"
    model.mkdir()
    (model / "config.json").write_text(text, encoding="utf-8")
    done = kvbench(capsys, monkeypatch, "simulate", "--engine", "paged", "--model", str(model),
                   "--num-requests", "5", "--kv-cache-gib", "0.01", "--out", str(out))  # fmt: skip
    assert_one_error(*done, f"--model {model}", says)
    assert not out.exists()


def test_a_sweep_whose_arrivals_would_outrun_float64_names_count_and_rates(tmp_path, capsys, monkeypatch):
    """10**5 requests at 1e-5 req/s arrive over 1e10 s, where float64 times lose their
    microseconds; --duration gives no count, the baseline cells theirs."""
    out = tmp_path / "sw"
    base = ("sweep", "--engines", "paged", "--model", "tiny-opt", "--kv-cache-gib", "0.002",
            "--trace", "fixed:prompt=4,output=4", "--out", str(out))  # fmt: skip
    done = kvbench(capsys, monkeypatch, *base, "--num-requests", "100000", "--rates", "1e-5,1")
    assert_one_error(*done, "--num-requests 100000 at --rates 1e-05")
    done = kvbench(capsys, monkeypatch, *base, "--rates", "1", "--baseline-requests", "2000",
                   "--baseline-rate", "1e-6")  # fmt: skip
    assert_one_error(*done, "--baseline-requests 2000 at --baseline-rate 1e-06")
    assert not out.exists()


def _real_run(out: Path, model: str, seed: int) -> Path:
    """A real run of a tiny model on the CPU (as tests/test_calibrate_held_out.py makes them)."""
    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from kvbench.simulate import write_result
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("uniform:prompt=8..24,output=4..12", num_requests=6, rate=1e4, seed=seed)
    config = RunConfig(engine="paged", model=model, workload=workload, kv_cache_gib=0.01, block_size=4,
                       attention="torch", max_num_seqs=2)  # fmt: skip
    write_result(run_real(config), out)
    return out


def test_calibrate_refuses_a_held_out_run_of_another_model_before_writing(tmp_path, capsys, monkeypatch):
    """It was refused only when replayed against the file already written, naming a --cost-model
    that calibrate has no flag for."""
    fit, held = _real_run(tmp_path / "fit", "tiny-opt", 1), _real_run(tmp_path / "held", "tiny-llama", 2)
    cost = tmp_path / "cost.json"
    done = kvbench(capsys, monkeypatch, "calibrate", str(fit), "--held-out", str(held), "--out", str(cost))
    line = assert_one_error(*done, f"--held-out {held}", "tiny-llama", "tiny-opt")
    assert "--cost-model" not in line
    assert not cost.exists()


@pytest.mark.parametrize(
    ("damage", "words"),
    [({"block_size": 0}, "--block-size must be a positive power of two"),
     ({"engine": "nosuch"}, "unknown --engine 'nosuch'"),
     ({"workload": {"seed": "three"}}, "not a kvbench run config")],
    ids=["block-size", "engine", "seed"],
)  # fmt: skip
def test_calibrate_refuses_a_held_out_run_a_replay_could_not_run_before_writing(
    tmp_path, capsys, monkeypatch, damage, words
):
    """A held-out config.json that kvbench refuses (or that holds a string where the seed is a
    number, once a TypeError) is a line naming that file, and no fit is written before it."""
    fit, held = _real_run(tmp_path / "fit", "tiny-opt", 1), _real_run(tmp_path / "held", "tiny-opt", 2)
    recorded = json.loads((held / "config.json").read_text())
    workload = {**recorded["workload"], **damage.pop("workload", {})}
    (held / "config.json").write_text(json.dumps({**recorded, **damage, "workload": workload}))
    cost = tmp_path / "cost.json"
    done = kvbench(capsys, monkeypatch, "calibrate", str(fit), "--held-out", str(held), "--out", str(cost))
    assert_one_error(*done, f"--held-out {held / 'config.json'}", words)
    assert not cost.exists()


def test_reproduce_mode_real_without_cuda_names_the_mode_before_writing(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "rp"
    done = kvbench(capsys, monkeypatch, "reproduce", "fig2", "--out", str(out), "--mode", "real")
    line = assert_one_error(*done, "--mode real")
    assert "--device" not in line
    assert not out.exists()


def test_reproduce_place_only_needs_no_cuda(tmp_path, capsys, monkeypatch):
    """--place-only simulates where Figure 12's real runs go, on any machine: the CUDA check of
    --mode real once refused it on the CPUs it is meant for. Here it gets as far as --out (a
    folder kvbench did not write, refused before any placement runs)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps({"model": "opt-125m", "fixed_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6})
    )
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    done = kvbench(capsys, monkeypatch, "reproduce", "fig12", "--mode", "real", "--model", "opt-125m",
                   "--place-with", str(cost), "--place-only", "--quick", "--out", str(out))  # fmt: skip
    assert_one_error(*done, f"--out {out}", "did not write")
    assert (out / "notes.txt").read_text() == "mine" and len(list(out.iterdir())) == 1
    done = kvbench(capsys, monkeypatch, "reproduce", "fig12", "--mode", "real", "--model", "opt-125m",
                   "--quick", "--out", str(tmp_path / "real"))  # fmt: skip
    assert_one_error(*done, "--mode real: no CUDA device")  # without --place-only: real runs, refused


def test_a_sweep_duration_past_a_traces_size_names_duration_and_rates(tmp_path, capsys, monkeypatch):
    """1e6 req/s for 1e6 s is 1e12 requests: once refused as a --num-requests never typed."""
    out = tmp_path / "sw"
    done = kvbench(capsys, monkeypatch, "sweep", "--engines", "paged", "--rates", "1e6", "--duration", "1e6",
                   "--out", str(out))  # fmt: skip
    line = assert_one_error(*done, "--duration 1e+06", "--rates")
    assert "--num-requests" not in line
    assert not out.exists()


def test_one_trace_file_spelled_two_ways_is_given_twice(tmp_path, capsys, monkeypatch):
    (tmp_path / "tr").mkdir()
    (tmp_path / "tr" / "good.csv").write_text("prompt_len,output_len\n4,4\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    done = kvbench(capsys, monkeypatch, *SWEEP, "--rates", "1", "--trace", "tr/good.csv",
                   "--trace", "./tr/good.csv", "--out", "sw")  # fmt: skip
    assert_one_error(*done, "--trace: ./tr/good.csv (the same as tr/good.csv) is given twice")
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize(
    "command",
    [
        ("run", "--engine", "paged", "--model", "tiny-opt", "--device", "cpu", "--num-requests", "2"),
        ("sweep", "--real", "--engines", "paged,orca-oracle", "--model", "tiny-opt", "--device", "cpu",
         "--num-requests", "2"),
    ],
    ids=["run", "sweep"],
)  # fmt: skip
def test_an_hf_flag_for_kvbenchs_own_engines_is_refused(tmp_path, capsys, monkeypatch, command):
    """The --hf-* flags set up transformers' engines: a run or a real sweep of kvbench's own
    engines would ignore them while its config.json recorded them."""
    out = tmp_path / "out"
    done = kvbench(capsys, monkeypatch, *command, "--hf-memory", "0.5", "--out", str(out))
    assert_one_error(*done, "--hf-memory 0.5 sets up the external engines", "leave it out")
    assert not out.exists()


@pytest.mark.parametrize(
    ("engines", "flag", "what", "reader"),
    [("paged", ("--vmm-map", "ahead"), "sets up the vmm engine's arena", "vmm"),
     ("orca-oracle", ("--vmm-page-kib", "64"), "sets up the vmm engine's arena", "vmm"),
     ("paged,orca-oracle", ("--vmm-layout", "per-request"), "sets up the vmm engine's arena", "vmm"),
     ("orca-oracle", ("--watermark", "0.05"), "keeps memory free at admission", "hybrid"),
     ("paged,vmm", ("--contiguous-fit", "first-fit"), "places the extents of contiguous engines", "static"),
     ("hybrid", ("--preemption", "swap"), "swaps the blocks of paged engines' victims", "paged-prefix"),
     ("static", ("--block-size", "32"), "sizes the blocks of block-table engines", "jenga"),
     ("orca-pow2,vmm", ("--block-sizes", "8,16"), "sizes the blocks of block-table engines", "paged")],
)  # fmt: skip
def test_an_arena_flag_no_engine_reads_is_refused(tmp_path, capsys, monkeypatch, engines, flag, what, reader):
    """An arena flag that none of the engines reads (`engines.EngineSpec.reads`, each entry pinned
    by tests/test_engine_reads.py) would be ignored while config.json recorded it; with one engine
    among a sweep's that reads it, it applies to that engine."""
    out = tmp_path / "out"
    command = (
        ("sweep", "--engines", engines)
        if "," in engines or flag[0] == "--block-sizes"
        else ("simulate", "--engine", engines)
    )
    done = kvbench(capsys, monkeypatch, *command, *flag, "--num-requests", "3", "--out", str(out))
    assert_one_error(*done, f"{' '.join(flag)} {what}", "never read", "leave it out")
    assert not out.exists()
    swept = ("--block-sizes", flag[1]) if flag[0].startswith("--block-size") else flag
    mixed = ("sweep", "--engines", f"{engines},{reader}", *swept, "--num-requests", "3", "--out", str(out))
    code, _, err = kvbench(capsys, monkeypatch, *mixed)
    assert code == 0, err


def test_swap_space_without_swapping_is_refused(tmp_path, capsys, monkeypatch):
    """--swap-space-gib sizes what --preemption swap parks in host memory: under recompute (the
    default) nothing is parked, so the flag would be recorded and ignored."""
    out = tmp_path / "out"
    args = (
        "simulate",
        "--engine",
        "paged",
        "--swap-space-gib",
        "1",
        "--num-requests",
        "3",
        "--out",
        str(out),
    )
    assert_one_error(
        *kvbench(capsys, monkeypatch, *args), "--swap-space-gib 1.0", "--preemption swap", "leave it out"
    )
    assert not out.exists()
    code, _, err = kvbench(capsys, monkeypatch, *args[:3], "--preemption", "swap", *args[3:])
    assert code == 0, err


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory) -> Path:
    """A sweep of two engines and two rates on the tiny model (simulated)."""
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    out = tmp_path_factory.mktemp("fuzzed") / "sw"
    args = ["sweep", "--engines", "paged,orca-oracle", "--model", "tiny-opt", "--kv-cache-gib", "0.002",
            "--trace", "fixed:prompt=4,output=4", "--num-requests", "5", "--rates", "1,2",
            "--latency-threshold", "1", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def _copy(folder: Path, to: Path) -> Path:
    import shutil

    return Path(shutil.copytree(folder, to))


def test_an_empty_path_names_no_folder(tmp_path, capsys, monkeypatch, small_sweep):
    """'' once read as the current folder: `report ''` compared, and wrote into, wherever the
    shell stood; `load_runs('')` read every run below it."""
    import kvbench as api
    from kvbench.errors import KvbenchError

    monkeypatch.chdir(small_sweep)  # a folder of runs: '' would have found them
    held = ("calibrate", str(small_sweep), "--held-out", "", "--out", str(tmp_path / "c.json"))
    for args in (("report", "", "--out", str(tmp_path / "r")), ("compare", ""), ("calibrate", ""), held):
        assert_one_error(*kvbench(capsys, monkeypatch, *args), "an empty path names no folder")
    assert not (tmp_path / "r").exists() and not (small_sweep / "report").exists()
    for load in (api.load_runs, api.load_run, api.load_sweep):
        with pytest.raises(KvbenchError, match="an empty path names no folder"):
            load("")


def test_a_byte_order_mark_on_a_results_table_is_read_past(tmp_path, small_sweep):
    """A spreadsheet saving a CSV as "UTF-8 with BOM" once made its first column '\\ufeffrequest_id'
    (a KeyError traceback in compare, report, calibrate and the loaders)."""
    import kvbench as api

    sweep = _copy(small_sweep, tmp_path / "sw")
    cell = sorted((sweep / "cells").iterdir())[0]
    before = api.load_run(cell)
    for name in ("requests.csv", "steps.csv"):
        (cell / name).write_bytes(b"\xef\xbb\xbf" + (cell / name).read_bytes())
    (sweep / "sweep.csv").write_bytes(b"\xef\xbb\xbf" + (sweep / "sweep.csv").read_bytes())
    after = api.load_run(cell)
    assert list(after.requests.columns) == list(before.requests.columns)
    assert after.steps.equals(before.steps)
    assert api.load_sweep(sweep).cells.equals(api.load_sweep(small_sweep).cells)


def test_a_damaged_sweep_table_is_one_line(tmp_path, capsys, monkeypatch, small_sweep):
    """sweep.csv cut to its header (report once failed in matplotlib), and a word in a number
    column of sustained.csv (read untyped, printed, and the sustained marks dropped from plots)."""
    header_only = _copy(small_sweep, tmp_path / "header")
    lines = (header_only / "sweep.csv").read_text().splitlines()
    (header_only / "sweep.csv").write_text(lines[0] + "\n")
    done = kvbench(capsys, monkeypatch, "report", str(header_only), "--out", str(tmp_path / "r1"))
    assert_one_error(*done, "sweep.csv", "no cells")
    worded = _copy(small_sweep, tmp_path / "worded")
    with open(worded / "sustained.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows[0]["rates_tried"] = "many"
    with open(worded / "sustained.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    done = kvbench(capsys, monkeypatch, "report", str(worded), "--out", str(tmp_path / "r2"))
    assert_one_error(*done, "sustained.csv", "'rates_tried'", "'many' is not a number")
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_a_step_of_no_known_kind_is_refused_where_steps_are_read(tmp_path, capsys, monkeypatch):
    """calibrate once fitted a row of kind 'bogus' (or 'Prefill') as a decode row, silently."""
    import kvbench as api
    from kvbench.errors import KvbenchError

    run = _real_run(tmp_path / "run", "tiny-opt", 1)
    with open(run / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows[-1]["kind"] = "Prefill"
    with open(run / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    where = f"column 'kind', line {len(rows) + 1}: 'Prefill' is not a step kind (prefill, decode, mixed)"
    cost = tmp_path / "cost.json"
    assert_one_error(*kvbench(capsys, monkeypatch, "calibrate", str(run), "--out", str(cost)), where)
    assert not cost.exists()
    with pytest.raises(KvbenchError, match=re.escape(where)):
        api.load_run(run)


@pytest.mark.parametrize(
    ("flag", "words"),
    [(("--prefix", ""), "--prefix '' names no prefix"),
     (("--tokenizer", "tok"), "--tokenizer applies to text datasets"),
     (("--no-text-filter",), "--no-text-filter applies to text datasets")],
    ids=["prefix", "tokenizer", "text-filter"],
)  # fmt: skip
def test_a_workload_flag_its_trace_ignores_is_refused(tmp_path, capsys, monkeypatch, flag, words):
    """Read as no prefix, or shaping only a text dataset's tokens, they were ignored while the
    run's config.json, or the made trace's header, recorded them."""
    out = tmp_path / "out"
    done = kvbench(capsys, monkeypatch, *SWEEP[:1], *SWEEP[3:], "--rates", "1", *flag, "--out", str(out))
    assert_one_error(*done, words)
    made = tmp_path / "t.jsonl"
    done = kvbench(capsys, monkeypatch, "trace", "make", "fixed:prompt=4,output=4", "--num-requests", "3",
                   "--rate", "2", *flag, "--out", str(made))  # fmt: skip
    assert_one_error(*done, words)
    assert not out.exists() and not made.exists()


def test_a_sweeps_cell_given_beside_its_sweep_is_shown_once(capsys, monkeypatch, small_sweep):
    """It was listed twice, and the clash of labels turned every label into a full path."""
    cell = sorted((small_sweep / "cells").iterdir())[0]
    code, alone, err = kvbench(capsys, monkeypatch, "compare", str(small_sweep))
    assert code == 0, err
    code, both, err = kvbench(capsys, monkeypatch, "compare", str(small_sweep), str(cell))
    assert code == 0, err
    assert both == alone


def _edit_csv(path: Path, row: int, column: str, value: str) -> None:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    rows[row][column] = value
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize(
    ("damage", "words"),
    [("request_throughput", "'request_throughput' must be >= 0, got -2.5"),
     ("mean_ttft_s", "'mean_ttft_s' must be >= 0"),
     ("occupancy", "'occupancy.token_states' must be a share of the arena in [0, 1], got 7.5"),
     ("occupancy-sum", "'occupancy' sums to"),
     ("ttft_s", "column 'ttft_s', line 2: '-1.0' is not a number >= 0"),
     ("duration_s", "column 'duration_s', line 3: '-0.5' is not a number >= 0"),
     ("rate", "column 'rate', line 2: -5.0 is not a rate")],
)  # fmt: skip
def test_a_number_out_of_its_range_in_a_result_is_refused(
    tmp_path, capsys, monkeypatch, small_sweep, damage, words
):
    """Negative throughputs and latencies, shares of the arena past 1 and rates below 0 were read
    and shown (a Figure 12 point at -5 req/s): kvbench writes none of them."""
    sweep = _copy(small_sweep, tmp_path / "sw")
    cell = sorted((sweep / "cells").iterdir())[-1]
    summary = json.loads((cell / "summary.json").read_text())
    if damage in ("request_throughput", "mean_ttft_s"):
        summary[damage] = -2.5 if damage == "request_throughput" else -1.0
    elif damage == "occupancy":
        summary["occupancy"]["token_states"] = 7.5
    elif damage == "occupancy-sum":
        summary["occupancy"] = {name: 0.5 for name in summary["occupancy"]}
    elif damage == "ttft_s":
        _edit_csv(cell / "requests.csv", 0, "ttft_s", "-1.0")
    elif damage == "duration_s":
        _edit_csv(cell / "steps.csv", 1, "duration_s", "-0.5")
    else:
        _edit_csv(sweep / "sweep.csv", 0, "rate", "-5.0")
    (cell / "summary.json").write_text(json.dumps(summary))
    target = sweep if damage == "rate" else cell
    assert_one_error(*kvbench(capsys, monkeypatch, "compare", str(target)), words)


def test_a_mode_kvbench_never_writes_is_refused(tmp_path, capsys, monkeypatch):
    """'weird' was read as a simulated run by calibrate, whose message then said why a fit to a
    cost model's step times would return that model."""
    run = _real_run(tmp_path / "run", "tiny-opt", 1)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "mode": "weird"}))
    words = "'mode' must be one of real, simulated, got \"weird\""
    done = kvbench(capsys, monkeypatch, "calibrate", str(run), "--out", str(tmp_path / "c.json"))
    assert "'mode' must be one of real, simulated" in assert_one_error(*done, str(run / "summary.json"))
    assert_one_error(*kvbench(capsys, monkeypatch, "compare", str(run)), words)


def test_a_table_that_is_a_folder_is_refused_not_read_as_absent(tmp_path, capsys, monkeypatch, small_sweep):
    import kvbench as api
    from kvbench.errors import KvbenchError

    cell = _copy(sorted((small_sweep / "cells").iterdir())[0], tmp_path / "run")
    (cell / "steps.csv").unlink()
    (cell / "steps.csv").mkdir()
    with pytest.raises(KvbenchError, match="steps.csv: is not a file"):
        api.load_run(cell)
    assert_one_error(
        *kvbench(capsys, monkeypatch, "report", str(cell), "--out", str(tmp_path / "r")), "is not a file"
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [(("simulate", "--engine", "paged", "--trace", ""), "--trace: an empty spec names no trace"),
     (("simulate", "--engine", "paged", "--cost-model", ""), "--cost-model: an empty path names no file"),
     (("trace", "stats", ""), "TRACE: an empty spec names no trace")],
    ids=["trace", "cost-model", "trace-stats"],
)  # fmt: skip
def test_an_empty_trace_or_cost_file_is_named_as_empty(tmp_path, capsys, monkeypatch, args, words):
    """'' once read as the current folder: "--trace : is a folder", a message naming nothing."""
    assert_one_error(*kvbench(capsys, monkeypatch, *args, "--num-requests", "3", "--out", str(tmp_path / "o"))
                     if args[0] == "simulate" else kvbench(capsys, monkeypatch, *args), words)  # fmt: skip


def test_a_line_break_in_a_run_folders_name_stays_inside_its_markdown_cell(
    tmp_path, capsys, monkeypatch, small_sweep
):
    cell = _copy(sorted((small_sweep / "cells").iterdir())[0], tmp_path / "two\nlines")
    code, out, err = kvbench(capsys, monkeypatch, "compare", "--markdown", str(cell))
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert rows and all(line.endswith("|") for line in rows)  # no row cut in two
    assert "two lines" in rows[0]
