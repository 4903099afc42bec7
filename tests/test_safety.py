"""What kvbench must never do: import or run code it did not ship, listen on the network, reach
the network from a run, write outside its folders, or show a progress total that shrinks."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvbench.errors import KvbenchError
from kvbench.sweep.cell import child_env, package_root
from kvbench.sweep.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
MARKER_CODE = "from pathlib import Path\nPath({marker!r}).write_text('ran')\n"


def kvbench_from(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`kvbench ARGS` started in `cwd` as an installed command is: the current folder is not on
    the import path (a `python -m` from `cwd` would import that folder's packages itself)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-P", "-m", "kvbench", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


# --- sweep --isolate: a cell imports this kvbench, never the current folder's ----------------------


def hostile_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A folder holding a decoy `kvbench/` and an `engines/` package that leave a marker file."""
    folder, marker = tmp_path / "hostile", tmp_path / "marker"
    for package in ("engines", "kvbench", "workloads"):
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text(MARKER_CODE.format(marker=str(marker)))
    (folder / "kvbench" / "__main__.py").write_text("raise SystemExit('the decoy kvbench ran')\n")
    return folder, marker


def test_isolated_cells_started_from_a_hostile_folder_run_this_kvbench(tmp_path):
    folder, marker = hostile_folder(tmp_path)
    proc = kvbench_from(
        folder, "sweep", "--engines", "paged,orca-oracle", "--rates", "2", "--kv-cache-gib", "1",
        "--num-requests", "20", "--max-total-len", "1000", "--latency-threshold", "1", "--isolate",
        "--out", "out",  # relative: the cells still write where the user is
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "a package from the current folder was imported"
    rows = (folder / "out" / "sweep.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",ok," in row for row in rows[1:]), rows
    for cell in (folder / "out" / "cells").iterdir():
        assert (cell / "summary.json").is_file()


def test_the_childs_environment_puts_this_kvbench_first_and_the_current_folder_nowhere():
    env = child_env({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": "elsewhere"})
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(package_root()), "elsewhere"]
    assert (package_root() / "kvbench" / "__main__.py").is_file() and (package_root() / "engines").is_dir()


# --- tensor parallelism: loopback only, nothing executable crosses ----------------------------------


def listening_addresses(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket these processes listen on (Linux /proc)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path(f"/proc/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            host, port = local.split(":")
            raw = bytes.fromhex(host)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian words
            found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc")
def test_a_tensor_parallel_group_listens_on_loopback_and_refuses_a_pickle(tmp_path, capfd, monkeypatch):
    """A real gloo group on the CPU, started from a folder holding a `multiprocessing/` package:
    the workers never import it; every socket the ranks listen on is loopback; a pickle sent as
    an arena operation (what the workers once unpickled) is refused, not run."""
    from kvbench.models import get_model
    from kvbench.parallel.channel import Command
    from kvbench.parallel.session import launch

    folder, imported = tmp_path / "hostile", tmp_path / "imported"
    (folder / "multiprocessing").mkdir(parents=True)
    (folder / "multiprocessing" / "__init__.py").write_text(MARKER_CODE.format(marker=str(imported)))
    monkeypatch.chdir(folder)  # the workers' current folder
    before = listening_addresses([os.getpid()])
    session = launch(get_model("tiny-opt"), size=2, device=torch.device("cpu"), dtype=torch.float32)
    try:
        pids = [os.getpid()] + [p.pid for p in session.processes]
        opened = listening_addresses(pids) - before
        assert opened, "found no listening socket of the group (the store's at least)"
        assert all(is_loopback(address) for address, _ in opened), opened
        assert not imported.exists(), "a worker imported a package from the current folder"

        marker = tmp_path / "unpickled"

        class Hostile:
            def __reduce__(self):
                return (Path.write_text, (marker, "ran"))

        payload = torch.frombuffer(bytearray(pickle.dumps(("_swap", (Hostile(),)))), dtype=torch.uint8)
        session.send(Command.MIRROR, (16, 0), (payload,))  # the old, pickled format
        worker = session.processes[0]
        worker.join(timeout=120)
        assert worker.exitcode is not None, "the worker went on after a message it cannot decode"
        assert not marker.exists()
        assert "refused a message" in capfd.readouterr().err
    finally:
        session.close(clean=False)


@pytest.mark.parametrize(
    ("ints", "tensor", "message"),
    [
        ((16, 0, 1), torch.frombuffer(bytearray(pickle.dumps(("x", ()))), dtype=torch.uint8), "int64"),
        ((16, 0), torch.zeros(1, 3, dtype=torch.int64), "not an arena operation"),
        ((16, 0, 7), torch.zeros(1, 3, dtype=torch.int64), "unknown arena operation 7"),
        ((16, 0, 0), torch.zeros(1, 2, dtype=torch.int64), "expected int64 rows [N, 3]"),
        ((16, 0, 0), torch.tensor([[2, 0, 1]]), "direction"),
        ((16, 0, 1), torch.tensor([[-1, 0]]), "negative"),
        ((0, 0, 1), torch.tensor([[1, 0]]), "block size"),
    ],
)
def test_an_arena_operation_that_is_not_one_is_refused(ints, tensor, message):
    from kvbench.parallel.channel import Command, Message, decode_mirror

    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_mirror(Message(Command.MIRROR, ints, (tensor,)))


def test_arena_operations_travel_as_integers():
    from kvbench.parallel.channel import Command, Message, Mirror, decode_mirror, encode_mirror

    for op, rows in ((Mirror.SWAP, ((1, 4, 0), (0, 2, 7))), (Mirror.COPY_BLOCKS, ((3, 5),))):
        ints, tensors = encode_mirror(op, 16, 8, rows)
        assert all(t.dtype == torch.int64 for t in tensors)
        assert decode_mirror(Message(Command.MIRROR, tuple(ints), tuple(tensors))) == (op, 16, 8, rows)


# --- dataset: traces are local: no network, no cache in the home folder -----------------------------

SITE_NO_NETWORK = """\
import socket
_connect = socket.socket.connect
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        with open({log!r}, "a") as log:
            log.write(repr(address) + "\\n")
        raise OSError("no network in this test")
    return _connect(self, address)
socket.socket.connect = connect
"""


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    """A word-level tokenizer saved as a local Hugging Face folder (nothing downloaded)."""
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    words = "what is the answer to this question it is a long one".split()
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tokenizer")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"})
    )
    return folder


def offline_env(tmp_path: Path) -> tuple[dict, Path, Path]:
    """HOME in `tmp_path`, HF caches unset, and a sitecustomize that refuses every connection."""
    home, site, log = tmp_path / "home", tmp_path / "site", tmp_path / "connects.log"
    home.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE_NO_NETWORK.format(log=str(log)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_"))}
    env |= {"HOME": str(home), "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return env, home, log


def test_a_dataset_trace_reads_a_local_file_offline_and_caches_nothing_at_home(tmp_path, tokenizer_folder):
    data = tmp_path / "qa.jsonl"
    records = [{"q": "what is the answer to this question", "a": "it is a long one"}] * 6
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    env, home, log = offline_env(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "kvbench", "simulate", "--engine", "paged",
         "--trace", f"dataset:{data}?prompt=q&response=a", "--tokenizer", str(tokenizer_folder),
         "--num-requests", "4", "--rate", "10", "--kv-cache-gib", "1", "--out", str(tmp_path / "run")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] == 4
    assert not log.exists(), log.read_text()  # no connection was even tried
    assert list(home.iterdir()) == [], sorted(str(p) for p in home.rglob("*"))


def test_offline_datasets_sets_the_switches_and_puts_them_back(tmp_path):
    datasets = pytest.importorskip("datasets")
    from workloads.text import OFFLINE_ENV, offline_datasets

    before = {name: os.environ.get(name) for name in OFFLINE_ENV}, datasets.config.HF_HUB_OFFLINE
    with offline_datasets() as (module, cache):
        assert all(os.environ[name] == "1" for name in OFFLINE_ENV)
        assert module.config.HF_HUB_OFFLINE is True and Path(cache).is_dir()
    assert ({name: os.environ.get(name) for name in OFFLINE_ENV}, datasets.config.HF_HUB_OFFLINE) == before
    assert not Path(cache).exists()


def test_a_missing_dataset_path_is_one_line(tmp_path, tokenizer_folder):
    missing = tmp_path / "nowhere.jsonl"
    proc = kvbench_from(
        tmp_path, "simulate", "--engine", "paged", "--trace", f"dataset:{missing}?prompt=q&response=a",
        "--tokenizer", str(tokenizer_folder), "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {missing}: no such file or folder "
                                                "(dataset: reads a local file or folder)"]  # fmt: skip
    assert not (tmp_path / "run").exists()


# --- Ray: a worker's file names stay inside the cell folder ----------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("/etc/cron.d/x", "is an absolute path"),
        ("C:\\x", "is an absolute path"),
        ("../sweep.csv", "contains '..'"),
        ("plots/../../x", "contains '..'"),
        ("..\\x", "contains '..'"),
        (".", "leaves the cell's folder"),
        ("", "is not a file name"),
        ("a\0b", "is not a file name"),
    ],
)
def test_a_ray_workers_file_name_outside_the_cell_is_refused(tmp_path, name, why):
    from kvbench.sweep.ray_executor import write_files

    out = tmp_path / "cells" / "grid__paged__rate-2"
    with pytest.raises(KvbenchError) as error:
        write_files(out, {"summary.json": b"{}", name: b"x"})
    assert str(error.value) == (
        f"cell grid__paged__rate-2: the Ray worker returned a file name {name!r}, which {why}"
    )
    assert not out.exists() and not (tmp_path / "cells" / "sweep.csv").exists()


def test_a_ray_workers_files_inside_the_cell_are_written(tmp_path):
    from kvbench.sweep.ray_executor import write_files

    out = tmp_path / "cells" / "c"
    write_files(out, {"summary.json": b"{}", "plots/a.png": b"png"})
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "plots/a.png", "summary.json"
    ]  # fmt: skip


# --- progress: the total never shrinks --------------------------------------------------------------


def test_cells_a_bisection_does_not_need_count_as_skipped():
    stream = io.StringIO()
    progress = Progress(6, stream=stream)
    for _ in range(2):
        progress.begin("cell")
        progress.finish(True, 0.5)
    progress.plan(-3)
    assert (progress.done, progress.total, progress.skipped) == (5, 6, 3)
    progress.plan(+2)  # a later round asks for more after all
    progress.begin("cell")
    progress.finish(True, 0.5)
    progress.plan(-9)  # never past the total
    progress.close()
    totals = [line.split()[1] for line in stream.getvalue().splitlines()]
    assert totals == ["1/6", "2/6", "6/8", "8/8"], stream.getvalue()
    assert stream.getvalue().splitlines()[-1].startswith("[" + "#" * 24 + "] 8/8 cells, 5 skipped")


def test_a_sweep_whose_bisection_ends_early_keeps_its_total(tmp_path):
    """Every rate passes: no bracket to bisect, so the 2 planned bisection cells are skipped."""
    from kvbench.config import RunConfig
    from kvbench.sweep.grid import Axes
    from kvbench.sweep.plan import SustainedOptions, SweepPlan
    from kvbench.sweep.run import run_sweep
    from workloads.spec import WorkloadSpec

    axes = Axes(("paged",), ("sharegpt-paper",), (1.0, 2.0), (16,), (4.0,), (0,), 1)
    base = RunConfig("paged", workload=WorkloadSpec(num_requests=20, max_total_len=1000))
    plan = SweepPlan(axes, base, sustained=SustainedOptions(threshold_s=1e6, bisect=2))
    stream = io.StringIO()
    run_sweep(plan, tmp_path / "s", progress=Progress(4, stream=stream))
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "4/4"], lines
    assert lines[-1].startswith("[" + "#" * 24 + "] 4/4 cells, 2 skipped")
