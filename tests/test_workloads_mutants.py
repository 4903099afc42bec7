"""Rules of the trace files, the public-trace loaders, the arrival processes and the vmm page
geometry that a mutation run of those modules found unpinned: every refusal's whole line (file,
line, column, the value found) where the tests matched a few words of it or met only one of a
loader's columns, what the Azure, vidur/etalon and Mooncake loaders record beside the requests
(the trace's name, its format, Mooncake's hash block size), which format a file is read as when
its suffix and its content disagree, the closest format named when none matches, a write's
temporary file beside its target, and the edges of the arrival processes and the page count.

Every input is a few lines written to tmp_path (or a model preset), so each expected message is
written out whole. docs/MUTATION.md says why such tests exist; the mutants they kill, and those
that are equivalent, are in results/mutation/workloads/.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from kvbench.models import get_model
from kvbench.requests import Request, Trace
from kvbench.vmm.pages import page_geometry
from tests.support import error_of, refusal, write
from workloads.arrivals import AllAtOnce, Gamma, Poisson, check_int, poisson_arrivals, replay
from workloads.tracefile import read_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_COLUMNS = "(Azure trace columns: TIMESTAMP, ContextTokens, GeneratedTokens)"
STATS_HEADER = "num_prefill_tokens,num_decode_tokens"
KNOWN = (
    "(known formats: kvbench-trace CSV: request_id, arrival_s, prompt_len, output_len; Azure trace: "
    "TIMESTAMP, ContextTokens, GeneratedTokens; vidur/etalon stats: num_prefill_tokens, "
    "num_decode_tokens; kvbench-trace JSONL: request_id, arrival_s, prompt_len, output_len; "
    "Mooncake trace: timestamp, input_length, output_length; kvbench-trace Parquet)"
)


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def mooncake(timestamp: object = 0, input_length: object = 600, output_length: object = 10, **more) -> str:
    """One Mooncake record; `hash_ids` as many 512-token blocks as the prompt has, unless given."""
    hashes = list(range(math.ceil(input_length / 512))) if isinstance(input_length, int) else []
    row = {"timestamp": timestamp, "input_length": input_length, "output_length": output_length}
    return json.dumps({**row, "hash_ids": hashes, **more})


def trace(name: str = "t", group: str | None = None) -> Trace:
    reqs = (Request(0, 0.0, 5, 3, prefix_group=group, prefix_len=2 if group else 0), Request(1, 0.5, 6, 2))
    return Trace(name, reqs, source="unit test", meta={"timestamps": True})


# ---------------------------------------------------------------- the public traces' loaders


def test_an_azure_trace_is_named_after_its_file_and_records_its_format_and_start(tmp_path):
    """An Azure file's trace is called by the file's stem, and its meta (which `kvbench trace make`
    writes into a converted trace's header) says the format and the first row's wall-clock time."""
    loaded = read_trace(write(tmp_path / "conv.csv", AZURE_HEADER, "2023-11-16 18:15:46.5,5,6"))
    assert loaded.name == "conv"
    assert loaded.meta == {
        "format": "azure-llm-inference",
        "timestamps": True,
        "start": "2023-11-16T18:15:46.500000000",
    }


def test_every_bad_azure_cell_is_named_by_its_own_column(tmp_path):
    """Each Azure column's refusal names that column as the file spells it (GeneratedTokens, not
    output_len), and a row of the wrong width names the file's three columns."""
    first = "2023-11-16 18:15:46.5,5,6"
    cases = {
        "2023-11-16 18:15:48,7,x": "line 3, column GeneratedTokens: not a number, got 'x'",
        "2023-11-16 18:15:48,0,8": "line 3, column ContextTokens: must be >= 1, got 0",
        "2023-11-16 18:15:48,7,0": "line 3, column GeneratedTokens: must be >= 1, got 0",
        "2023-11-16 18:15:48,7": (
            "line 3: expected 3 cells (TIMESTAMP, ContextTokens, GeneratedTokens), got 2"
        ),
    }
    for row, why in cases.items():
        path = write(tmp_path / "az.csv", AZURE_HEADER, first, row)
        assert error_of(path) == f"{path}: {why}"


def test_a_stats_trace_is_named_after_its_file_and_records_that_it_has_no_timestamps(tmp_path):
    """A vidur/etalon stats file's trace is called by the file's stem and its meta says the format
    and that its arrivals are not times (a workload then draws them instead of replaying zeros)."""
    loaded = read_trace(write(tmp_path / "arxiv.csv", STATS_HEADER, "9,4"))
    assert loaded.name == "arxiv"
    assert loaded.meta == {"format": "vidur-stats", "timestamps": False}


def test_every_bad_stats_cell_is_named_by_its_own_column(tmp_path):
    """Each stats column's refusal names that column (the prompt's is num_prefill_tokens, not
    num_decode_tokens), a row of the wrong width names both, and a column row alone is no trace."""
    cases = {
        "x,4": "line 3, column num_prefill_tokens: not a number, got 'x'",
        "9,y": "line 3, column num_decode_tokens: not a number, got 'y'",
        "0,4": "line 3, column num_prefill_tokens: must be >= 1, got 0",
        "9,4,1": "line 3: expected 2 cells (num_prefill_tokens, num_decode_tokens), got 3",
    }
    for row, why in cases.items():
        path = write(tmp_path / "v.csv", STATS_HEADER, "9,4", row)
        assert error_of(path) == f"{path}: {why}"
    path = write(tmp_path / "h.csv", STATS_HEADER)
    assert error_of(path) == f"{path}: the trace has no requests"


def test_a_mooncake_trace_is_named_after_its_file_and_hashes_only_when_its_rows_do(tmp_path):
    """A Mooncake file's trace is called by the file's stem with the format in its meta; it has
    512-token hash blocks when rows carry hash_ids, and none (no prefix-cache keys) otherwise."""
    hashed = read_trace(write(tmp_path / "conv.jsonl", mooncake(0), mooncake(5)))
    assert (hashed.name, hashed.hash_block_size) == ("conv", 512)
    assert hashed.meta == {"format": "mooncake", "timestamps": True}
    bare = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 10})
    plain = read_trace(write(tmp_path / "bare.jsonl", bare, bare))
    assert (plain.name, plain.hash_block_size) == ("bare", None)
    assert [r.block_hashes for r in plain.requests] == [None, None]


def test_every_bad_mooncake_field_is_named_whole(tmp_path):
    """A Mooncake timestamp that is not a number, an input_length of 0 and hash_ids that are not
    a list of integers are each refused naming the line, the field and the value (a long value
    cut at 60 characters)."""
    long_value = [0.5] * 30
    cases = {
        mooncake("soon"): "line 2, column timestamp: must be a number, got 'soon'",
        mooncake(5, input_length=0): "line 2, column input_length: must be >= 1, got 0",
        mooncake(5, hash_ids=[1, "2"]): "line 2, column hash_ids: must be a list of integers, got [1, '2']",
        mooncake(5, hash_ids=long_value): "line 2, column hash_ids: must be a list of integers, got "
        + str(long_value)[:60],
    }
    for row, why in cases.items():
        path = write(tmp_path / "m.jsonl", mooncake(0), row)
        assert error_of(path) == f"{path}: {why}"


# ---------------------------------------------------------------- detecting the format


@pytest.mark.parametrize(
    "bad",
    [
        '{"timestamp": 0, "input_length": 600  ',  # cut short, spaces after: the column is past them
        '{"timestamp": 0, "timestamp": 1, "input_length": 600, "output_length": 10}',
        mooncake(0) + "X",  # stray text after the record
        "[" + ", ".join(map(str, range(30))) + "]",  # not an object; shown cut at 40 characters
    ],
    ids=["cut", "twice", "stray", "list"],
)
def test_a_bad_first_record_is_refused_as_the_same_record_further_down(tmp_path, bad):
    """The first line of a JSON-lines file is read on its own (to detect the format); a bad one is
    refused with the same line as a bad record later in the file: file, line, column, what."""
    first = error_of(write(tmp_path / "first.jsonl", bad, mooncake(5)))
    later = error_of(write(tmp_path / "later.jsonl", mooncake(0), mooncake(5), bad))
    assert first.startswith(f"{tmp_path / 'first.jsonl'}: line 1")
    assert first.replace("first.jsonl: line 1", "later.jsonl: line 3") == later


def test_the_first_records_own_refusals_in_whole(tmp_path):
    """The exact lines for a first record cut short, with a key given twice, or not an object, and
    for a kvbench JSON-lines header with stray text after it."""
    path = write(tmp_path / "a.jsonl", '{"timestamp": 0,')
    assert (
        error_of(path)
        == f"{path}: line 1, column 17: invalid JSON (Expecting property name enclosed in double quotes)"
    )
    path = write(tmp_path / "b.jsonl", '{"timestamp": 0, "timestamp": 1}')
    assert error_of(path) == f"{path}: line 1, column timestamp: given twice in one object"
    path = write(tmp_path / "c.jsonl", "[1, 2]")
    assert error_of(path) == f"{path}: line 1: expected a JSON object, got '[1, 2]'"
    header = write_trace(trace(), tmp_path / "t.jsonl").read_text().splitlines()[0]
    path = write(tmp_path / "d.jsonl", header + "X")  # a kvbench header is read once, never again
    assert error_of(path) == f"{path}: line 1, column {len(header) + 1}: invalid JSON (Extra data)"


def test_a_json_object_of_another_format_lists_the_known_ones(tmp_path):
    """A JSON-lines header of another format, or an empty first object, is refused naming what
    the line holds and every format kvbench reads."""
    path = write(tmp_path / "o.jsonl", json.dumps({"format": "other", "name": "x"}))
    assert error_of(path) == f"{path}: line 1: unknown trace format, found columns format, name {KNOWN}"
    path = write(tmp_path / "e.jsonl", "{}")
    assert error_of(path) == f"{path}: line 1: unknown trace format, found columns (none) {KNOWN}"


def test_the_content_decides_the_format_whatever_the_suffix(tmp_path):
    """A Mooncake trace saved as .txt is read as JSON lines (its first line opens an object), and
    a kvbench CSV with its '#' header saved as .jsonl is read as the CSV it is."""
    text = read_trace(write(tmp_path / "m.txt", mooncake(0), mooncake(250)))
    assert [r.arrival_s for r in text.requests] == [0.0, 0.25] and text.name == "m"
    csv_path = write_trace(trace("mine"), tmp_path / "t.csv")
    os.replace(csv_path, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == trace("mine")


def test_a_kvbench_csv_header_alone_or_unspaced(tmp_path):
    """A kvbench CSV whose '#' header has no column row after it is refused naming line 2; one
    written '#{...}' without the space reads; a header that is not JSON names line and column."""
    csv_path = write_trace(trace("mine"), tmp_path / "t.csv")
    header, *rest = csv_path.read_text().splitlines()
    path = write(tmp_path / "alone.csv", header)
    assert error_of(path) == f"{path}: line 2: no column row after the kvbench-trace header"
    unspaced = write(tmp_path / "unspaced.csv", "#" + header.removeprefix("# "), *rest)
    assert read_trace(unspaced) == trace("mine")
    path = write(tmp_path / "bad.csv", "# {oops", *rest)
    assert (
        error_of(path)
        == f"{path}: line 1, column 3: invalid JSON (Expecting property name enclosed in double quotes)"
    )


@pytest.mark.parametrize(
    ("third", "hint"),
    [("gen_tokens", ", found 'gen_tokens'"), ("num_generated", "")],
)
def test_a_missing_column_names_a_near_miss_only_when_it_is_close(tmp_path, third, hint):
    """A column row missing GeneratedTokens names the column the user most likely meant when it is
    close (gen_tokens: 3/4 alike once case and punctuation are dropped), and nothing otherwise
    (num_generated, 2/3 alike)."""
    path = write(tmp_path / "az.csv", f"TIMESTAMP,ContextTokens,{third}", "2023-11-16 18:15:46.5,5,6")
    assert error_of(path) == f"{path}: line 1: no column 'GeneratedTokens'{hint} {AZURE_COLUMNS}"


@pytest.mark.parametrize(
    ("names", "why"),
    [
        # three near Azure names beat one exact kvbench name
        (
            "request_id,timestamp,context_tokens,generated_tokens",
            f"no column 'TIMESTAMP', found 'timestamp' {AZURE_COLUMNS}",
        ),
        # two exact Azure names beat two near kvbench ones
        ("RequestId,ArrivalS,TIMESTAMP,ContextTokens", f"no column 'GeneratedTokens' {AZURE_COLUMNS}"),
        # near names alone still point at their format
        (
            "timestamp,context_tokens,generated_tokens",
            f"no column 'TIMESTAMP', found 'timestamp' {AZURE_COLUMNS}",
        ),
    ],
)
def test_the_closest_format_weighs_exact_names_twice_near_ones(tmp_path, names, why):
    """When no format matches, the one whose columns the row most resembles is named (an exact
    name counts 2, a near one 1), so the fix the message suggests is the likely one."""
    path = write(tmp_path / "x.csv", names)  # detection reads the column row alone
    assert error_of(path) == f"{path}: line 1: {why}"


# ---------------------------------------------------------------- reading and writing files


def test_a_file_that_cannot_be_opened_or_decoded_is_one_line(tmp_path):
    """A missing file and a file that is not UTF-8 text are refused naming the file and why."""
    missing = tmp_path / "none.csv"
    assert error_of(missing) == f"{missing}: cannot read (No such file or directory)"
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00request_id\n")
    assert error_of(binary) == f"{binary}: not UTF-8 text (invalid start byte)"


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    """A CSV saved with a UTF-8 byte order mark (as spreadsheet programs write it) reads."""
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + f"{STATS_HEADER}\n9,4\n".encode())
    assert [(r.prompt_len, r.output_len) for r in read_trace(path).requests] == [(9, 4)]


def test_parquet_is_recognised_by_its_magic_and_a_parquet_suffix_is_never_read_as_text(tmp_path):
    """A Parquet trace renamed without its suffix still reads; a text file named .parquet is
    refused as unreadable Parquet rather than read as text; a Parquet table without kvbench's
    header is called by the file's stem."""
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = write_trace(trace("mine"), tmp_path / "t.parquet")
    os.replace(path, tmp_path / "t.data")
    assert read_trace(tmp_path / "t.data") == trace("mine")
    fake = write(tmp_path / "fake.parquet", "request_id,arrival_s,prompt_len,output_len", "0,0,5,3")
    assert error_of(fake).startswith(f"{fake}: not a readable Parquet file (")
    columns = {"request_id": [0], "arrival_s": [0.0], "prompt_len": [5], "output_len": [3]}
    pq.write_table(pa.table(columns), tmp_path / "plain.parquet")
    assert read_trace(tmp_path / "plain.parquet").name == "plain"


def test_write_refusals_name_the_file_and_the_reason(tmp_path, monkeypatch):
    """An unknown suffix lists the known ones; a missing folder, a directory in the way and a
    missing pyarrow each say so in one line naming the file, and no temporary file is left."""
    bad = tmp_path / "t.txt"
    assert (
        refusal(write_trace, trace(), bad)
        == f"{bad}: unknown trace file suffix '.txt' (use .jsonl, .csv, .parquet)"
    )
    nowhere = tmp_path / "missing" / "t.jsonl"
    assert refusal(write_trace, trace(), nowhere) == f"{nowhere}: cannot write (No such file or directory)"
    folder = tmp_path / "t.jsonl"
    folder.mkdir()
    assert refusal(write_trace, trace(), folder) == f"{folder}: cannot write (Is a directory)"
    assert os.listdir(tmp_path) == ["t.jsonl"] and os.listdir(folder) == []
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    parquet = tmp_path / "t.parquet"
    assert refusal(write_trace, trace(), parquet) == f"{parquet}: Parquet needs pyarrow: pip install pyarrow"


_renames: list[tuple[str, str]] = []


def _record_renames(event: str, args: tuple) -> None:
    if event == "os.rename":
        _renames.append((os.fsdecode(args[0]), os.fsdecode(args[1])))


sys.addaudithook(_record_renames)  # audit hooks stay for the process: it only appends to a list


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_write_goes_through_a_hidden_temporary_file_beside_its_target(tmp_path, monkeypatch, suffix):
    """The trace is written to `.NAME.<random>.tmp` in the target's own folder and renamed over
    it: the rename never crosses file systems (even with TMPDIR elsewhere), and a crash mid-write
    leaves only a hidden .tmp file, never a half-written trace under the target's name."""
    elsewhere = tmp_path / "tmpdir"
    elsewhere.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(elsewhere))
    target = tmp_path / "out" / f"t{suffix}"
    target.parent.mkdir()
    _renames.clear()
    write_trace(trace(), target)
    [temporary] = [Path(a) for a, b in _renames if Path(b) == target]
    assert temporary.parent == target.parent
    assert temporary.name.startswith(f".t{suffix}.") and temporary.name.endswith(".tmp")
    assert len(temporary.name) > len(f".t{suffix}..tmp")
    assert os.listdir(target.parent) == [target.name] and os.listdir(elsewhere) == []


def test_a_trace_with_non_ascii_text_is_written_as_utf8_whatever_the_locale(tmp_path):
    """Trace files are UTF-8 whatever the locale's encoding: a trace with a non-ASCII prefix group
    written under an ASCII locale reads back as written."""
    write_trace(trace(), tmp_path / "ascii.csv")  # the same writer in this process, for coverage
    path = tmp_path / "t.csv"  # JSON lines escape non-ASCII text; CSV cells keep it as it is
    script = (
        "from kvbench.requests import Request, Trace; from workloads.tracefile import write_trace; "
        "reqs = (Request(0, 0.0, 5, 3, prefix_group='na\\u00efve', prefix_len=2), Request(1, 0.5, 6, 2)); "
        f"write_trace(Trace('caf\\u00e9', reqs, source='unit test', meta={{}}), {str(path)!r})"
    )  # escaped: an ASCII locale cannot pass the letters themselves on the command line
    env = {
        **os.environ,
        "LC_ALL": "C",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONUTF8": "0",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read_trace(path) == trace("café", group="naïve")
    assert "naïve".encode() in path.read_bytes()


# ---------------------------------------------------------------- arrivals


def test_a_request_count_must_be_a_whole_number_not_a_bool_or_a_float():
    """--num-requests and spec counts refuse True and 2.5 (a bool is an int to Python) naming the
    value, instead of running 1 or 2 requests."""
    for bad in (True, 2.5):
        assert (
            refusal(poisson_arrivals, bad, 1.0, rng())
            == f"--num-requests must be an integer >= 0, got {bad!r}"
        )
        assert (
            refusal(check_int, "max_requests", bad, 1) == f"max_requests must be an integer >= 1, got {bad!r}"
        )


@pytest.mark.parametrize("process", [AllAtOnce(), Poisson(2.0), Gamma(2.0, 0.5)], ids=repr)
def test_each_process_names_num_requests_in_its_refusal(process):
    """A process asked for -1 requests says which setting is wrong: num_requests."""
    assert refusal(process.times, -1, rng()) == "num_requests must be an integer >= 0, got -1"


def test_the_offline_process_describes_itself():
    """AllAtOnce's one-line description, as a report or a test id shows it."""
    assert AllAtOnce().describe() == "all at t=0"


def test_replay_refusals_in_whole():
    """A replay of no times, of unsorted times, or from a start that is not a number of seconds
    (True, '1') is refused with its own line, not a TypeError."""
    assert refusal(replay, np.zeros(0)) == "replay needs a non-empty 1-D array of arrival times"
    assert (
        refusal(replay, np.array([1.0, 0.5])) == "replay needs finite arrival times in non-decreasing order"
    )
    for start in (True, "1"):
        assert refusal(replay, np.array([0.0, 1.0]), start_s=start) == (
            f"start_s must be a finite number of seconds, got {start!r}"
        )


def test_replayed_times_are_float64_whatever_the_times_handed_in():
    """replay's times are float64, as documented, whatever the dtype of the times handed in:
    float32 times are re-based and scaled in float64, not rounded again to float32's 0.25 ms
    steps over an hour."""
    _, times = replay(np.array([0.0, 1.25, 3600.001], dtype=np.float32))
    assert times.dtype == np.float64 and times[2] == float(np.float32(3600.001))


def test_a_replay_window_holding_one_request_replays_it_at_zero():
    """A window that holds exactly one request gives that row, arriving at t = 0."""
    index, times = replay(np.array([0.0, 1.0, 2.0]), start_s=1.0, duration_s=0.5)
    assert index.tolist() == [1] and times.tolist() == [0.0]


# ---------------------------------------------------------------- vmm page geometry


def test_page_flags_are_refused_in_whole_and_4_kib_pages_are_taken():
    """A layout that does not exist lists both; a page size not a positive multiple of 4 KiB
    (6, 0) is refused naming it; 4 KiB, the smallest, is taken."""
    opt = get_model("opt-13b")
    assert refusal(page_geometry, opt, 1 << 30, "per-token", 2048) == (
        "--vmm-layout must be one of per-layer, per-request, got 'per-token'"
    )
    for bad in (6, 0):
        assert refusal(page_geometry, opt, 1 << 30, "per-layer", bad) == (
            f"--vmm-page-kib must be a positive multiple of 4, got {bad}"
        )
    small = page_geometry(opt, 1 << 30, "per-layer", 4)
    assert (small.layout, small.driver_page_bytes, small.page_tokens) == ("per-layer", 4096, Fraction(2, 5))


def test_an_mla_models_per_layer_pages_hold_its_latent_and_the_count_is_whole():
    """DeepSeek-V2-Lite keeps one latent of 1,152 bytes a token and layer in place of K and V:
    under the per-layer layout a page group is one 2 MiB page in each of its 27 layers' tensors
    (not 2 x 27 pages sized by its 16 query heads, which mapped 113 groups, 14 % of the arena's
    slots), so the pages cover the slots the budget buys; the count is a whole number (the vmm
    engine numbers its pages with range()) and the bytes bound it too."""
    budget = 12 << 30
    model = get_model("deepseek-v2-lite")
    pages = page_geometry(model, budget, "per-layer", 2048)
    assert pages.page_bytes == 27 * 2048 * 1024 and pages.page_tokens == Fraction(2048 * 1024, 1152)
    slots = budget // model.kv_bytes_per_token  # 414,252
    assert pages.num_pages == 227 and type(pages.num_pages) is int
    assert pages.num_pages * pages.page_bytes <= budget
    assert slots - pages.page_tokens < pages.num_pages * pages.page_tokens <= slots  # all but a page's tail
    llama = page_geometry(get_model("llama-3-8b"), budget, "per-layer", 2048)
    assert llama.num_pages == 96 and type(llama.num_pages) is int  # both bounds exactly 96
    assert llama.page_bytes == 2 * 32 * 2048 * 1024  # K and V pages of every layer


def test_a_simulated_vmm_run_of_an_mla_model_leaves_no_arena_to_external_fragmentation(tmp_path):
    """The latent-sized pages cover the arena: a simulated vmm run of DeepSeek-V2-Lite counts
    under 1 % of it as external fragmentation (sized by K/V heads, the pages left 86 % of it so)."""
    from tests.test_cli import kvbench

    args = ("simulate", "--engine", "vmm", "--model", "deepseek-v2-lite", "--kv-cache-gib", "12",
            "--rate", "4", "--num-requests", "20", "--seed", "0")  # fmt: skip
    done = kvbench(*args, "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))
    assert summary["completed"] == 20
    assert summary["occupancy"]["external_frag"] < 0.01
