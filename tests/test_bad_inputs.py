"""Bad checkpoints, model configs, trace files and workload flags, as a user meets them.

Every case goes through the real command line (`kvbench run --model DIR --device cpu`,
`kvbench simulate --trace FILE`) and must end in exit code 2 with one line on stderr that names
the file and the key, row or column to fix, and no traceback. The checkpoints are written here
from a real tiny kvbench model with safetensors, then broken one way each; the positive cases
check that the unbroken checkpoint and traces still load and run.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from kvbench.cli.app import app
from kvbench.errors import KvbenchError
from kvbench.modeling.weights import load_checkpoint, random_model
from kvbench.models import ModelSpec
from workloads.spec import WorkloadSpec, build_trace

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
VOCAB = 101
HEADER = '{"format": "kvbench-trace", "version": 1, "name": "t"}'


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def refused(result, *names: str) -> str:
    """The one line a refused command printed; it names every one of `names`."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


# --- checkpoints -------------------------------------------------------------------------------


def hf_config(family: str) -> dict:
    config = {
        "model_type": family, "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
        "vocab_size": VOCAB, "max_position_embeddings": 64,
    }  # fmt: skip
    if family == "llama":
        return {**config, "num_key_value_heads": 2, "intermediate_size": 64, "rms_norm_eps": 1e-6}
    return {**config, "ffn_dim": 64, "word_embed_proj_dim": 32, "do_layer_norm_before": True}


def save_checkpoint(folder: Path, family: str) -> torch.nn.Module:
    """A tiny kvbench model saved as a Hugging Face checkpoint: packed projections unpacked into
    their q/k/v (gate/up) tensors, OPT's tied LM head left out, as transformers writes them."""
    spec = ModelSpec("tiny", family, 2, 32, 4, 2 if family == "llama" else 4, 64, VOCAB, 64)
    model = random_model(spec, torch.float32, CPU, seed=0)
    tensors = {}
    for name, param in model.named_parameters():  # a tied parameter is listed once
        module, _, leaf = name.rpartition(".")
        prefix, _, last = module.rpartition(".")
        if last in model.packed:
            parts = param.split(model.get_submodule(module).sections)
            for part, tensor in zip(model.packed[last], parts, strict=True):
                tensors[f"{prefix}.{part}.{leaf}"] = tensor.contiguous()
        else:
            tensors[name] = param.contiguous()
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(hf_config(family)))
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("checkpoints")
    return {family: (save_checkpoint(base / family, family), base / family)[1] for family in ("llama", "opt")}


def run_model(folder: Path, out: Path, *trace: str):
    return cli(
        "run", "--model", str(folder), "--device", "cpu", "--engine", "paged", "--kv-cache-gib", "0.001",
        "--out", str(out), *(trace or ("--trace", "fixed:prompt=8,output=3", "--rate", "100")),
        "--num-requests", "2",
    )  # fmt: skip


def set_keys(**changes) -> Callable[[Path], None]:
    """Change config.json's keys (None: remove the key)."""

    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        config = {k: v for k, v in config.items() if v is not None}
        (folder / "config.json").write_text(json.dumps(config))

    return change


def write_file(name: str, data: bytes | str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())

    return change


def edit_tensors(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        tensors = load_file(folder / "model.safetensors")
        edit(tensors)
        save_file(tensors, folder / "model.safetensors")

    return change


def as_bin(payload: Callable[[Path], None]) -> Callable[[Path], None]:
    """Replace the safetensors file by a pytorch_model.bin that `payload` writes."""

    def change(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        payload(folder / "pytorch_model.bin")

    return change


K_PROJ = "model.layers.0.self_attn.k_proj.weight"

CONFIG_CASES = {  # id: (family, change, names the error line must hold)
    "json-list": ("llama", write_file("config.json", "[1, 2]"), ["config.json", "JSON list"]),
    "json-string": ("llama", write_file("config.json", '"llama"'), ["config.json", "JSON string"]),
    "invalid-json": (
        "llama",
        write_file("config.json", '{"model_type": '),
        ["config.json", "not valid JSON"],
    ),
    "not-utf8": ("llama", write_file("config.json", b"\xff\xfe{}"), ["config.json", "UTF-8"]),
    "too-deep": ("llama", write_file("config.json", "[" * 100_000), ["config.json"]),
    "string-size": ("llama", set_keys(hidden_size="32"), ["config.json", "hidden_size", "'32'"]),
    "float-size": ("llama", set_keys(hidden_size=32.0), ["config.json", "hidden_size", "32.0"]),
    "bool-size": ("opt", set_keys(ffn_dim=True), ["config.json", "ffn_dim"]),
    "heads-divide": ("llama", set_keys(num_attention_heads=5), ["config.json", "num_attention_heads"]),
    "kv-heads-divide": ("llama", set_keys(num_key_value_heads=3), ["config.json", "num_key_value_heads"]),
    "negative-layers": ("llama", set_keys(num_hidden_layers=-2), ["config.json", "num_hidden_layers", "-2"]),
    "zero-layers": ("opt", set_keys(num_hidden_layers=0), ["config.json", "num_hidden_layers"]),
    "zero-vocab": ("opt", set_keys(vocab_size=0), ["config.json", "vocab_size"]),
    "missing-vocab": ("llama", set_keys(vocab_size=None), ["config.json", "vocab_size"]),
    "missing-ffn": ("opt", set_keys(ffn_dim=None), ["config.json", "ffn_dim"]),
    "missing-type": ("llama", set_keys(model_type=None), ["config.json", "model_type"]),
    "unknown-type": ("llama", set_keys(model_type="gpt2"), ["config.json", "model_type", "gpt2"]),
    "list-type": ("llama", set_keys(model_type=["llama"]), ["config.json", "model_type"]),
    "bad-eps": ("llama", set_keys(rms_norm_eps=-1e-6), ["config.json", "rms_norm_eps"]),
    "bad-theta": ("llama", set_keys(rope_theta="big"), ["config.json", "rope_theta"]),
    "other-activation": ("llama", set_keys(hidden_act="gelu"), ["config.json", "hidden_act", "gelu"]),
    "other-head-dim": ("llama", set_keys(head_dim=16), ["config.json", "head_dim"]),
    "odd-head-dim": ("llama", set_keys(hidden_size=36), ["config.json", "head size"]),
    "rope-scaling": (
        "llama",
        set_keys(rope_scaling={"rope_type": "llama3"}),
        ["config.json", "rope_scaling"],
    ),
    "projected-embedding": ("opt", set_keys(word_embed_proj_dim=16), ["config.json", "word_embed_proj_dim"]),
    "post-layernorm": ("opt", set_keys(do_layer_norm_before=False), ["config.json", "do_layer_norm_before"]),
    "flag-not-bool": ("opt", set_keys(enable_bias="yes"), ["config.json", "enable_bias"]),
    "enormous-vocab": (
        "llama",
        set_keys(vocab_size=10**9),
        ["config.json", "64,000,018,592 parameters", "hold 25,056"],
    ),
    "opt-activation": ("opt", set_keys(activation_function="gelu"), ["config.json", "activation_function"]),
}

WEIGHT_CASES = {
    "garbage-safetensors": ("llama", write_file("model.safetensors", b"garbage!" * 8), ["model.safetensors"]),
    "empty-safetensors": ("opt", write_file("model.safetensors", b""), ["model.safetensors"]),
    "truncated-safetensors": (
        "llama",
        lambda folder: (folder / "model.safetensors").write_bytes(
            (folder / "model.safetensors").read_bytes()[:4000]
        ),
        ["model.safetensors"],
    ),
    "missing-tensor": ("llama", edit_tensors(lambda t: t.pop(K_PROJ)), ["the weights lack", "k_proj"]),
    "short-packed-part": (
        "llama",
        edit_tensors(lambda t: t.update({K_PROJ: t[K_PROJ][:8].contiguous()})),
        ["model.safetensors", K_PROJ, "(8, 32)", "(16, 32)"],
    ),
    "integer-tensor": (
        "opt",
        edit_tensors(
            lambda t: t.update({"model.decoder.final_layer_norm.weight": torch.ones(32, dtype=torch.int64)})
        ),
        ["model.safetensors", "final_layer_norm.weight", "int64"],
    ),
    "zip-garbage-bin": (
        "opt",
        as_bin(lambda path: path.write_bytes(b"PK\x03\x04garbage")),
        ["pytorch_model.bin"],
    ),
    "empty-bin": ("opt", as_bin(lambda path: path.write_bytes(b"")), ["pytorch_model.bin"]),
    "list-bin": ("llama", as_bin(lambda path: torch.save([torch.zeros(2)], path)), ["pytorch_model.bin"]),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES | WEIGHT_CASES))
def test_a_broken_checkpoint_is_one_line_naming_the_file(case, checkpoints, tmp_path):
    family, change, names = (CONFIG_CASES | WEIGHT_CASES)[case]
    folder = tmp_path / family
    shutil.copytree(checkpoints[family], folder)
    change(folder)
    line = refused(run_model(folder, tmp_path / "out"), f"--model {folder}", *names)
    assert "kv-cache" not in line  # a bad config once surfaced as a bad --kv-cache-gib
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


class _Payload:
    """A pickle that, if ever unpickled, writes a file: what a malicious checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("zipped", [True, False], ids=["torch-save", "raw-pickle"])
def test_a_malicious_pytorch_model_bin_is_refused_without_running_it(zipped, checkpoints, tmp_path):
    folder, marker = tmp_path / "opt", tmp_path / "ran"
    shutil.copytree(checkpoints["opt"], folder)
    (folder / "model.safetensors").unlink()
    if zipped:
        torch.save({"model.decoder.embed_tokens.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    else:
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    assert not marker.exists()
    refused(run_model(folder, tmp_path / "out"), "pytorch_model.bin", "refused")
    assert not marker.exists()


def test_a_broken_checkpoint_in_a_real_process_prints_one_line_and_exits_2(checkpoints, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(checkpoints["llama"], folder)
    set_keys(num_hidden_layers=-2)(folder)
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", "run", "--model", str(folder), "--device", "cpu",
         "--engine", "paged", "--trace", "fixed:prompt=8,output=3", "--rate", "1",
         "--out", str(tmp_path / "o")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --model {folder}: config.json: num_hidden_layers must be an integer >= 1, got -2"
    ]


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_a_valid_checkpoint_loads_every_tensor_as_saved(family, tmp_path):
    model = save_checkpoint(tmp_path / family, family)
    loaded = load_checkpoint(tmp_path / family, torch.float32, CPU)
    saved = dict(model.named_parameters())
    assert list(dict(loaded.named_parameters())) == list(saved)
    for name, param in loaded.named_parameters():
        assert torch.equal(param, saved[name]), name


def test_a_mistral_sliding_window_makes_every_layer_a_window_layer(checkpoints, tmp_path):
    """Beyond its window a Mistral attends to its last `sliding_window` tokens only: every layer
    is decoded as a window layer (tests/test_families.py), the maximum length is the model's."""
    from kvbench.modeling.hf_config import read_checkpoint_spec

    folder = tmp_path / "mistral"
    shutil.copytree(checkpoints["llama"], folder)
    set_keys(model_type="mistral", sliding_window=16)(folder)
    spec = read_checkpoint_spec(folder)
    assert (spec.family, spec.max_len, spec.window, spec.window_layers) == ("mistral", 64, 16, (0, 1))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": None}))  # v0.2 and later
    spec = read_checkpoint_spec(folder)
    assert (spec.max_len, spec.window_layers) == (64, ())


# --- traces ------------------------------------------------------------------------------------


def row(**values) -> str:
    return json.dumps({"request_id": 0, "arrival_s": 0.0, "prompt_len": 4, "output_len": 2} | values)


CSV_HEAD = "request_id,arrival_s,prompt_len,output_len"
TRACE_CASES = {  # id: (file name, contents, names the line must hold beside the file)
    "prefix-over-prompt": (
        "t.jsonl",
        [HEADER, row(prefix_len=5, prefix_group="a")],
        ["line 2", "prefix_len"],
    ),
    "negative-arrival": (
        "t.jsonl",
        [HEADER, row(), row(request_id=1, arrival_s=-1)],
        ["line 3", "arrival_s"],
    ),
    "decreasing-arrival": ("t.jsonl", [HEADER, row(arrival_s=2), row(request_id=1, arrival_s=1)], ["line 3"]),
    "fractional-prompt": ("t.jsonl", [HEADER, row(prompt_len=4.5)], ["line 2", "prompt_len", "4.5"]),
    "fractional-csv": ("t.csv", [CSV_HEAD, "0,0,4,2.5"], ["line 2", "output_len", "2.5"]),
    "fractional-n": ("t.jsonl", [HEADER, row(n=1.5)], ["line 2", "column n"]),
    "ids-length": ("t.jsonl", [HEADER, row(prompt_ids=[1, 2, 3])], ["line 2", "prompt_ids", "prompt_len"]),
    "huge-id": ("t.jsonl", [HEADER, row(prompt_ids=[1, 2**70, 3, 4])], ["line 2", "prompt_ids"]),
    "nan-arrival": ("t.jsonl", [HEADER, row().replace("0.0", "NaN")], ["line 2", "arrival_s", "nan"]),
    "inf-prompt": ("t.jsonl", [HEADER, row(prompt_len=math.inf)], ["line 2", "prompt_len", "inf"]),
    "nan-optional-json": ("t.jsonl", [HEADER, row(n=math.nan)], ["line 2", "column n", "nan"]),
    "nan-optional-csv": (
        "t.csv",
        [CSV_HEAD + ",beam_width", "0,0,4,2,", "1,1,4,2,nan"],
        ["line 3", "beam_width"],
    ),
    "inf-optional-csv": ("t.csv", [CSV_HEAD + ",prefix_len", "0,0,4,2,inf"], ["line 2", "prefix_len", "inf"]),
    "nan-csv": ("t.csv", [CSV_HEAD, "0,nan,4,2"], ["line 2", "arrival_s", "nan"]),
    "inf-csv": ("t.csv", [CSV_HEAD, "0,0,4,-inf"], ["line 2", "output_len", "inf"]),
    "empty-file": ("t.csv", [], ["empty"]),
    "blank-lines": ("t.jsonl", ["", "  "], ["empty"]),
    "header-only": ("t.csv", [CSV_HEAD], ["no requests"]),
    "missing-column": ("t.csv", ["request_id,arrival_s,prompt_len", "0,0,4"], ["line 1", "output_len"]),
    "missing-cell": ("t.csv", [CSV_HEAD, "0,0,4"], ["line 2"]),
    "beyond-float-precision": ("t.csv", [CSV_HEAD, "0,0,1e20,2"], ["line 2", "prompt_len", "2**53"]),
    "text-in-number": ("t.csv", [CSV_HEAD, "0,0,four,2"], ["line 2", "prompt_len", "four"]),
    "key-twice": (
        "t.jsonl",
        [HEADER, row(), row(request_id=1)[:-1] + ', "prompt_len": 40}'],
        ["line 3", "column prompt_len: given twice"],
    ),
    "header-key-twice": (
        "t.jsonl",
        [HEADER[:-1] + ', "name": "u"}', row()],
        ["line 1", "column name: given twice"],
    ),
    "first-record-key-twice": ("t.jsonl", [row()[:-1] + ', "output_len": 3}'], ["line 1", "output_len"]),
}


def write_trace_file(folder: Path, name: str, lines: list[str]) -> Path:
    path = folder / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def simulate(trace: Path | str, out: Path, *flags: str):
    return cli(
        "simulate", "--engine", "paged", "--model", "tiny-llama", "--kv-cache-gib", "0.01",
        "--trace", str(trace), "--out", str(out), *flags,
    )  # fmt: skip


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_a_bad_trace_file_is_one_line_naming_file_row_and_column(case, tmp_path):
    name, lines, names = TRACE_CASES[case]
    path = write_trace_file(tmp_path, name, lines)
    refused(simulate(path, tmp_path / "out"), f"{path}: ", *names)


def test_a_trace_path_that_is_missing_or_a_folder_is_named_as_such(tmp_path):
    """A --trace that looks like a file (a slash, a trace suffix) is a missing file, and a folder
    a folder: not an unknown preset, which the user did not mean."""
    for trace in (tmp_path / "missing.jsonl", "missing.parquet", "data/missing"):
        line = refused(simulate(trace, tmp_path / "out"), f"--trace {trace}: no such file")
        assert "preset" not in line
    refused(simulate(tmp_path, tmp_path / "out"), f"--trace {tmp_path}: is a folder, not a trace file")
    assert "not a preset" in refused(simulate("sharegpt-papr", tmp_path / "out"), "sharegpt-papr")
    refused(cli("trace", "stats", str(tmp_path)), f"TRACE {tmp_path}: is a folder")
    refused(cli("trace", "stats", str(tmp_path / "t.csv")), f"TRACE {tmp_path / 't.csv'}: no such file")
    refused(cli("trace", "convert", str(tmp_path), str(tmp_path / "o.csv")), f"TRACE {tmp_path}: is a folder")
    assert not (tmp_path / "out").exists()


def test_a_prefix_too_long_for_the_model_is_blamed_on_prefix(tmp_path):
    """opt-125m holds 2,048 positions: a 5,000-token prefix fits no request, a 2,030-token one
    fits none of 10 + 10 tokens; either is --prefix's fault, not the trace's or the model's."""

    def run(*flags: str):
        return cli(
            "simulate", "--engine", "paged", "--model", "opt-125m", "--trace", "fixed:prompt=10,output=10",
            "--num-requests", "3", "--rate", "5", "--out", str(tmp_path / "out"), *flags,
        )  # fmt: skip

    line = refused(run("--prefix", "5000"), "--prefix 5000: 5000 tokens leave no room", "2048")
    assert "--trace" not in line and "--model" not in line
    line = refused(
        run("--prefix", "2030"), "--prefix 2030: request 0 has 2030 prefix + 10 prompt + 10 output"
    )
    assert "--max-total-len 18 drops" in line and "--trace" not in line
    assert run("--prefix", "2028").exit_code == 0


def test_a_trace_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(f"{CSV_HEAD}\n0,0,\xff\xfe,2\n".encode("latin-1"))
    refused(simulate(path, tmp_path / "out"), f"{path}: ", "UTF-8")


def test_a_stored_nan_in_an_optional_parquet_column_is_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_len": [4, 4], "output_len": [2, 2],
            "n": pa.array([None, math.nan], pa.float64()),
        }
    )  # fmt: skip
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    refused(simulate(path, tmp_path / "out"), f"{path}: ", "row 2", "column n", "nan")


def test_a_valid_trace_file_still_simulates(tmp_path):
    jsonl = write_trace_file(tmp_path, "t.jsonl", [HEADER, row(n=2), row(request_id=1, arrival_s=0.5)])
    csv = write_trace_file(
        tmp_path, "t.csv", [CSV_HEAD + ",beam_width", "0,0,4,2,", "1,0.5,4,2,2", "2,1,4,2,"]
    )
    for trace, count in ((jsonl, 2), (csv, 3)):
        out = tmp_path / trace.suffix[1:]
        result = simulate(trace, out)
        assert result.exit_code == 0, result.output
        assert json.loads((out / "summary.json").read_text())["completed"] == count


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_request_ids_above_2_to_the_53_are_read_exactly(suffix, tmp_path):
    """An integer id is kept as an integer: through a float it would become its neighbour."""
    big = 2**53 + 1
    lines = [HEADER, row(request_id=big)] if suffix == ".jsonl" else [CSV_HEAD, f"{big},0,4,2"]
    path = write_trace_file(tmp_path, "t" + suffix, lines)
    trace = build_trace(WorkloadSpec(str(path), arrivals="all"))
    assert [r.request_id for r in trace.requests] == [big]


# --- prompt token ids against the model's vocabulary --------------------------------------------


@pytest.mark.parametrize("token", [VOCAB, VOCAB + 1000])
def test_prompt_ids_outside_the_vocabulary_are_refused_before_the_run(token, checkpoints, tmp_path):
    ids = list(range(1, 8))
    path = write_trace_file(
        tmp_path,
        "t.jsonl",
        [
            HEADER,
            row(prompt_len=7, prompt_ids=ids),
            row(request_id=5, prompt_len=7, prompt_ids=[*ids[:6], token]),
        ],
    )
    line = refused(
        run_model(checkpoints["llama"], tmp_path / "out", "--trace", str(path)),
        f"{path}: ",
        "request_id 5",
        "prompt_ids",
        f"token id {token} ",
        f"vocabulary of {VOCAB} ids",
    )
    assert f"--model {checkpoints['llama']}" in line


def test_a_negative_prompt_id_is_refused_where_the_trace_is_read(checkpoints, tmp_path):
    ids = list(range(1, 8))
    bad = row(request_id=5, prompt_len=7, prompt_ids=[*ids[:6], -3])
    path = write_trace_file(tmp_path, "t.jsonl", [HEADER, row(prompt_len=7, prompt_ids=ids), bad])
    result = run_model(checkpoints["llama"], tmp_path / "out", "--trace", str(path))
    refused(result, str(path), "prompt_ids", ">= 0")


def test_a_valid_checkpoint_runs_a_trace_of_real_token_ids(checkpoints, tmp_path):
    path = write_trace_file(
        tmp_path, "t.jsonl",
        [HEADER, row(prompt_len=6, output_len=3, prompt_ids=[0, 5, 9, 50, 99, VOCAB - 1]),
         row(request_id=1, arrival_s=0.01)],
    )  # fmt: skip
    result = run_model(checkpoints["llama"], tmp_path / "out", "--trace", str(path))
    assert result.exit_code == 0, (result.output, result.exception)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["completed"] == 2 and summary["mode"] == "real"


# --- workload flags and --max-total-len -----------------------------------------------------------


FLAG_CASES = {  # flag values -> the flag the message must name, and the internal names it must not
    "window-start-nan": (["--window-start", "nan"], "--window-start"),
    "window-start-inf": (["--window-start", "inf"], "--window-start"),
    "window-duration-zero": (["--window-duration", "0"], "--window-duration"),
    "window-duration-nan": (["--window-duration", "nan"], "--window-duration"),
    "max-history-zero": (["--max-history", "0", "--chat-turns", "2"], "--max-history"),
    "time-scale-zero": (["--time-scale", "0"], "--time-scale"),
    "burstiness-zero": (["--arrivals", "gamma", "--rate", "1", "--burstiness", "0"], "--burstiness"),
    "seed-negative": (["--seed", "-1"], "--seed"),
    "max-total-len-one": (["--max-total-len", "1"], "--max-total-len"),
}
# a WorkloadSpec field or a helper's parameter, not preceded by the flag's dashes
INTERNAL_NAME = re.compile(
    r"(?<![-\w])(start_s|duration_s|max_prompt_len|time_scale|burstiness|max_requests)\b"
)


@pytest.fixture
def timed_trace(tmp_path) -> Path:
    lines = [HEADER, *(row(request_id=i, arrival_s=float(i), prompt_len=4 + 10 * i) for i in range(4))]
    return write_trace_file(tmp_path, "timed.jsonl", lines)


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_a_bad_workload_flag_is_named_as_typed(case, timed_trace, tmp_path):
    flags, flag = FLAG_CASES[case]
    line = refused(simulate(timed_trace, tmp_path / "out", *flags), flag)
    assert not INTERNAL_NAME.search(line), line


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"window_start_s": math.nan}, "--window-start"),
        ({"window_start_s": -1.0}, "--window-start"),
        ({"window_duration_s": 0.0}, "--window-duration"),
        ({"window_duration_s": math.inf}, "--window-duration"),
        ({"max_history": 0, "chat_turns": 2}, "--max-history"),
        ({"burstiness": -1.0, "arrivals": "gamma", "rate": 1.0}, "--burstiness"),
        ({"rate": math.inf, "arrivals": "constant"}, "--rate"),
        ({"seed": -1}, "--seed"),
        ({"max_total_len": 1}, "--max-total-len"),
        ({"arrivals": "poisson", "rate": 1.0, "window_start_s": 1.0}, "--window-start"),
        ({"arrivals": "all", "time_scale": 2.0}, "--time-scale"),
    ],
)
def test_the_workload_spec_names_flags_not_fields(fields, flag, timed_trace):
    """The spec checks its own values (a sweep or the Python API builds one without the CLI)."""
    with pytest.raises(KvbenchError) as error:
        build_trace(WorkloadSpec(str(timed_trace), **fields))
    assert str(error.value).startswith(flag) or f" {flag}" in str(error.value), str(error.value)
    assert not INTERNAL_NAME.search(str(error.value)), str(error.value)


SPEC_CASES = {  # a length spec -> what its one line must name
    "fixed:prompt=1e3,output=5": ["prompt must be an integer", "'1e3'"],
    "fixed:prompt=5,output=5,prompt=6": ["prompt= is given twice"],
    "fixed:prompt=99999999999999999999999,output=5": ["prompt must be at most"],
    "uniform:prompt=1..99999999999999999999,output=1..2": ["prompt_max must be at most"],
    "uniform:prompt=x..3,output=1..2": ["prompt LOW must be an integer", "'x'"],
    "lognormal:prompt_mean=1e300,prompt_cv=1,output_mean=10,output_cv=1": ["prompt_mean must be at most"],
    "lognormal:prompt_mean=10,prompt_cv=1e6,output_mean=10,output_cv=1": ["prompt_cv must be at most 100"],
    "lognormal:prompt_mean=abc,prompt_cv=1,output_mean=10,output_cv=1": ["prompt_mean must be a number"],
    "lognormal:prompt_mean=0.001,prompt_cv=0.1,output_mean=10,output_cv=1": [
        "round to 0",
        "prompt mean 0.001",
    ],
}


@pytest.mark.parametrize("spec", list(SPEC_CASES))
def test_a_bad_length_spec_is_one_line_naming_its_key(spec, tmp_path):
    line = refused(simulate(spec, tmp_path / "out", "--rate", "1", "--num-requests", "5"), *SPEC_CASES[spec])
    assert "invalid literal" not in line


def test_an_absurd_request_count_is_refused_before_drawing(tmp_path):
    """10**12 requests would exhaust memory drawing lengths: refused at once instead."""
    refused(simulate("sharegpt-paper", tmp_path / "out", "--num-requests", str(10**12)), "--num-requests")


def test_max_total_len_says_how_many_requests_it_dropped(timed_trace, tmp_path):
    """Prompts 4, 14, 24, 34 with outputs of 2: a limit of 20 keeps two and drops two."""
    result = simulate(timed_trace, tmp_path / "out", "--max-total-len", "20")
    assert result.exit_code == 0, result.output
    assert "--max-total-len 20: dropped 2 of 4 requests longer than 20 tokens" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["num_requests"] == 2
    assert (summary["dropped_requests"], summary["dropped_of"], summary["dropped_longer_than"]) == (2, 4, 20)
    kept = simulate(timed_trace, tmp_path / "all", "--max-total-len", "100")
    assert "dropped 0 of 4 requests" in kept.stdout
    plain = simulate(timed_trace, tmp_path / "plain")
    assert "dropped" not in plain.stdout
    assert "dropped_requests" not in json.loads((tmp_path / "plain" / "summary.json").read_text())


def test_num_requests_above_a_replayed_files_rows_is_refused(timed_trace, tmp_path):
    """Four rows replayed for --num-requests 100 would record 100 requests in config.json and run
    four: refused before the run, naming the file and what it holds, in the window and after
    --max-total-len too; a count the file holds still cuts the replay to its first rows."""
    refused(
        simulate(timed_trace, tmp_path / "out", "--num-requests", "100"),
        f"--num-requests 100: {timed_trace} has 4 rows;", "at most 4",
    )  # fmt: skip
    assert not (tmp_path / "out").exists()
    window = simulate(timed_trace, tmp_path / "w", "--num-requests", "3", "--window-start", "2")
    refused(window, "--num-requests 3", "has 4 rows, 2 of them in the --window-start", "at most 2")
    short = simulate(timed_trace, tmp_path / "m", "--num-requests", "3", "--max-total-len", "20")
    refused(short, "--num-requests 3", "has 4 rows, 2 within --max-total-len 20", "at most 2")
    for count in ("4", "2"):
        result = simulate(timed_trace, tmp_path / count, "--num-requests", count)
        assert result.exit_code == 0, result.output
        summary = json.loads((tmp_path / count / "summary.json").read_text())
        assert summary["num_requests"] == summary["completed"] == int(count)


def test_num_requests_above_a_retimed_files_rows_is_refused(timed_trace, tmp_path):
    """The same file re-timed by --arrivals poisson: four rows cannot make 100 requests either."""
    retimed = ("--arrivals", "poisson", "--rate", "2")
    result = simulate(timed_trace, tmp_path / "out", *retimed, "--num-requests", "100")
    refused(result, f"--num-requests 100: {timed_trace} has 4 rows;", "at most 4")
    assert not (tmp_path / "out").exists()
    ran = simulate(timed_trace, tmp_path / "three", *retimed, "--num-requests", "3")
    assert ran.exit_code == 0, ran.output
    assert json.loads((tmp_path / "three" / "summary.json").read_text())["num_requests"] == 3
    # a preset draws the count, and --max-total-len drops some of what it drew: not refused
    drawn = simulate("sharegpt-paper", tmp_path / "drawn", "--num-requests", "40", "--max-total-len", "1024")
    assert drawn.exit_code == 0, drawn.output


def test_a_sweeps_duration_past_a_files_rows_is_refused_before_any_cell(tmp_path):
    """--duration 60 at 2 req/s asks 120 requests of a 30-row file: running 30 would judge the
    rate on 15 seconds of load. Refused before any cell; within the rows, each rate's cell gets
    rate x duration requests (at least 20), and the baseline, a few requests far apart, takes the
    file's 30 rows instead of its usual 50."""
    lines = [HEADER, *(row(request_id=i, arrival_s=float(i), prompt_len=4 + i) for i in range(30))]
    trace = write_trace_file(tmp_path, "rows.jsonl", lines)
    flags = ("sweep", "--engines", "paged", "--model", "tiny-llama", "--kv-cache-gib", "0.01",
             "--trace", str(trace), "--arrivals", "poisson", "--rates", "0.05,2")  # fmt: skip
    result = cli(*flags, "--duration", "60", "--out", str(tmp_path / "long"))
    refused(
        result, "--duration 60 at 2 req/s: 120 requests (rate x duration, at least 20)", f"{trace} gives 30"
    )
    assert not (tmp_path / "long").exists()
    ran = cli(*flags, "--duration", "12.5", "--out", str(tmp_path / "within"))
    assert ran.exit_code == 0, ran.output
    cells = tmp_path / "within" / "cells"
    counts = {
        p.parent.name.split("__")[2]: json.loads(p.read_text())["num_requests"]
        for p in cells.glob("*/summary.json")
    }
    assert counts == {"rate-unloaded": 30, "rate-0.05": 20, "rate-2": 25}


def test_no_file_is_left_behind_by_a_refused_checkpoint(checkpoints, tmp_path):
    """kvbench reads checkpoint folders; a refusal must not write into them."""
    folder = tmp_path / "llama"
    shutil.copytree(checkpoints["llama"], folder)
    set_keys(num_attention_heads=5)(folder)
    before = sorted(os.listdir(folder))
    refused(run_model(folder, tmp_path / "out"), "num_attention_heads")
    assert sorted(os.listdir(folder)) == before
