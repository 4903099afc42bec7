"""Public traces by name: `kvbench trace fetch` against a real HTTP server on 127.0.0.1, the
registry's facts against the shared copies, and a registered name wherever a trace is taken.

The server serves a temporary copy of ../shared/traces laid out as the upstream raw URLs
(`<repo>/<commit>/<path>`), so the download, the streaming checksum and the atomic rename are the
real ones. Tests that need the shared copies skip where that folder is absent.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from workloads import registry
from workloads.spec import WorkloadSpec, build_trace

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
ENV_NAMES = (registry.TRACE_DIR_ENV, registry.CACHE_DIR_ENV, registry.URL_ENV)

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not present at {SHARED}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def kvbench(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The CLI in a real subprocess; `env` replaces the trace variables (others are dropped)."""
    base = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300, env={**base, **env},
    )  # fmt: skip


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


class Mirror:
    """A loopback HTTP server laid out as raw.githubusercontent.com, serving copies of the
    shared traces (each may then be altered by a test)."""

    def __init__(self, root: Path):
        self.root = root
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def served(self, trace: registry.PublicTrace) -> Path:
        """Where `trace`'s file is served from (what its URL asks for)."""
        return self.root / trace.repo / trace.commit / trace.path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def mirror(tmp_path):
    """Every registered trace with a shared copy, served on 127.0.0.1."""
    if not SHARED.is_dir():
        pytest.skip(f"shared traces not present at {SHARED}")
    server = Mirror(tmp_path / "served")
    for trace in registry.TRACES.values():
        if (SHARED / trace.local).is_file():
            server.served(trace).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SHARED / trace.local, server.served(trace))
    yield server
    server.close()


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """This process's trace variables pointed at an empty cache, no copies folder, no mirror."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(registry.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "traces"


def test_registry_urls_are_pinned_raw_github_urls():
    for trace in registry.TRACES.values():
        assert trace.url("https://raw.githubusercontent.com") == (
            f"https://raw.githubusercontent.com/{trace.repo}/{trace.commit}/{trace.path}"
        )
        assert len(trace.commit) == 40 and len(trace.sha256) == 64
        assert trace.license and trace.citation and trace.size > 0
    assert {"azure-conv", "arxiv-sum", "sharegpt-8k", "mooncake-conv"} <= set(registry.TRACES)


@needs_shared
@pytest.mark.parametrize("name", sorted(registry.TRACES))
def test_registry_matches_the_shared_copies(name):
    trace = registry.TRACES[name]
    copy = SHARED / trace.local
    if not copy.is_file():
        pytest.skip(f"no shared copy of {name} ({trace.local})")
    assert copy.stat().st_size == trace.size
    assert sha256(copy) == trace.sha256
    assert trace.license in (SHARED / "SOURCES.md").read_text()


def test_fetch_one_verifies_prints_license_and_resolves(mirror, tmp_path):
    env = {registry.CACHE_DIR_ENV: str(tmp_path / "cache"), registry.URL_ENV: mirror.url}
    proc = kvbench("trace", "fetch", "azure-conv", env=env)
    assert proc.returncode == 0, proc.stderr
    trace = registry.TRACES["azure-conv"]
    cached = tmp_path / "cache" / "traces" / trace.local
    assert files_under(tmp_path / "cache") == [cached]  # no temporary file left beside it
    assert sha256(cached) == trace.sha256
    assert "sha256 verified" in proc.stdout
    assert "license CC-BY-4.0" in proc.stdout and "Splitwise" in proc.stdout
    assert oct(cached.stat().st_mode & 0o777) == oct(0o644)

    mirror.close()  # a verified copy is not downloaded again, so no server is needed
    again = kvbench("trace", "fetch", "azure-conv", env=env)
    assert again.returncode == 0, again.stderr
    assert "already cached" in again.stdout and "license CC-BY-4.0" in again.stdout

    stats = kvbench("trace", "stats", "azure-conv", env={registry.CACHE_DIR_ENV: str(tmp_path / "cache")})
    assert stats.returncode == 0, stats.stderr
    assert "trace            azure-conv" in stats.stdout and "requests         19,366" in stats.stdout
    assert "mean rate        5.53 req/s" in stats.stdout


@pytest.mark.parametrize("damage", ["flip", "append", "truncate"])
def test_a_wrong_file_leaves_nothing_and_exits_2(mirror, tmp_path, damage):
    trace = registry.TRACES["azure-conv"]
    served = mirror.served(trace)
    data = bytearray(served.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01  # one byte changed, same size
    elif damage == "append":
        data += b"1"
    else:
        del data[-1]
    served.write_bytes(bytes(data))
    env = {registry.CACHE_DIR_ENV: str(tmp_path / "cache"), registry.URL_ENV: mirror.url}
    proc = kvbench("trace", "fetch", "azure-conv", env=env)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: azure-conv: ")
    assert mirror.url in proc.stderr and "Traceback" not in proc.stderr
    assert files_under(tmp_path / "cache") == []  # no partial file, no temporary file


def test_fetch_all_fetches_every_entry(mirror, tmp_path):
    env = {registry.CACHE_DIR_ENV: str(tmp_path / "cache"), registry.URL_ENV: mirror.url}
    proc = kvbench("trace", "fetch", "all", env=env)
    cache = tmp_path / "cache" / "traces"
    missing = [t for t in registry.TRACES.values() if not (SHARED / t.local).is_file()]
    for trace in registry.TRACES.values():
        if trace in missing:  # not served: named in the one-line error, nothing kept
            assert f"{trace.name}: {mirror.url}" in proc.stderr and "HTTP 404" in proc.stderr
            assert not (cache / trace.local).exists()
        else:
            assert sha256(cache / trace.local) == trace.sha256
            assert f"license {trace.license}; cite {trace.citation}" in proc.stdout
    assert proc.returncode == (2 if missing else 0), proc.stderr
    assert len(files_under(cache)) == len(registry.TRACES) - len(missing)


@needs_shared
def test_fetch_with_a_copies_folder_downloads_nothing(tmp_path):
    env = {
        registry.TRACE_DIR_ENV: str(SHARED),
        registry.CACHE_DIR_ENV: str(tmp_path / "cache"),
        registry.URL_ENV: "http://127.0.0.1:9",  # the discard port: any download would fail
    }
    proc = kvbench("trace", "fetch", "azure-conv", "mooncake-conv", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("verified copy in KVBENCH_TRACE_DIR") == 2 and "Mooncake" in proc.stdout
    assert not (tmp_path / "cache").exists()


def test_fetch_of_an_unknown_name_lists_the_names(tmp_path):
    proc = kvbench("trace", "fetch", "azure", env={registry.CACHE_DIR_ENV: str(tmp_path / "cache")})
    assert proc.returncode == 2
    assert proc.stderr == f"error: unknown trace 'azure'; registered: {', '.join(registry.TRACES)}\n"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("names", "words"),
    [(("azure-code", "azure-code"), "NAME: azure-code is given twice"),
     (("all", "azure-code"), "NAME: 'all' names every trace: give it alone")],
)  # fmt: skip
def test_fetch_of_a_name_twice_is_refused_before_any_download(tmp_path, names, words):
    proc = kvbench("trace", "fetch", *names, env={registry.CACHE_DIR_ENV: str(tmp_path / "cache")})
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {words}") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "cache").exists()


def test_fetch_help_says_it_downloads(tmp_path):
    proc = kvbench("trace", "--help", env={})
    assert proc.returncode == 0 and "Download public traces by name" in proc.stdout
    proc = kvbench("trace", "fetch", "--help", env={})
    assert "Download registered traces" in proc.stdout and "NAME|all" in proc.stdout


def test_an_unreachable_mirror_is_one_line(isolated, monkeypatch, tmp_path):
    server = Mirror(tmp_path / "empty")  # serves nothing: every file is a 404
    monkeypatch.setenv(registry.URL_ENV, server.url)
    try:
        with pytest.raises(KvbenchError, match=r"HTTP 404") as error:
            registry.fetch(registry.TRACES["mooncake-conv"])
    finally:
        server.close()
    assert "\n" not in str(error.value)
    assert files_under(isolated) == []
    monkeypatch.setenv(registry.URL_ENV, "ftp://example.org")
    with pytest.raises(KvbenchError, match=f"{registry.URL_ENV} must be an http"):
        registry.fetch(registry.TRACES["mooncake-conv"])


def test_an_unfetched_name_says_how_to_get_it(isolated):
    with pytest.raises(KvbenchError) as error:
        build_trace(WorkloadSpec("mooncake-conv", rate=1.0))
    assert str(error.value) == (
        "trace 'mooncake-conv' is not here: run `kvbench trace fetch mooncake-conv` (downloads 3,029,533 "
        "bytes) or set KVBENCH_TRACE_DIR to a folder of copies"
    )


def test_an_unfetched_name_exits_2_in_the_cli(tmp_path):
    proc = kvbench("trace", "stats", "arxiv-sum", env={registry.CACHE_DIR_ENV: str(tmp_path / "cache")})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "run `kvbench trace fetch arxiv-sum`" in proc.stderr


@needs_shared
def test_the_copies_folder_comes_first_and_is_verified(isolated, monkeypatch, tmp_path):
    monkeypatch.setenv(registry.TRACE_DIR_ENV, str(SHARED))
    assert registry.trace_file("mooncake-conv") == SHARED / "mooncake/conversation_trace.jsonl"
    assert registry.trace_file("some/file.csv") == Path("some/file.csv")  # not a name: a path

    copies = tmp_path / "copies"
    trace = registry.TRACES["arxiv-sum"]
    (copies / trace.local).parent.mkdir(parents=True)
    data = bytearray((SHARED / trace.local).read_bytes())
    data[100] ^= 0x01
    (copies / trace.local).write_bytes(bytes(data))
    monkeypatch.setenv(registry.TRACE_DIR_ENV, str(copies))
    with pytest.raises(KvbenchError, match=r"sha256 [0-9a-f]{64} is not arxiv-sum's") as error:
        registry.trace_file("arxiv-sum")
    assert str(error.value).startswith(f"{copies / trace.local}: ")
    # the folder lacks the Mooncake copy: the name falls back to the (empty) cache
    with pytest.raises(KvbenchError, match=r"KVBENCH_TRACE_DIR=.* has no mooncake/conversation_trace"):
        registry.trace_file("mooncake-conv")


@needs_shared
def test_a_name_builds_the_same_trace_as_its_file(isolated, monkeypatch):
    monkeypatch.setenv(registry.TRACE_DIR_ENV, str(SHARED))
    for name, options in (("azure-conv", {}), ("sharegpt-8k", {"rate": 2.0}), ("mooncake-conv", {})):
        by_name = build_trace(WorkloadSpec(name, num_requests=300, **options))
        by_path = build_trace(
            WorkloadSpec(str(SHARED / registry.TRACES[name].local), num_requests=300, **options)
        )
        assert by_name.requests == by_path.requests and by_name.name == name
    resampled = build_trace(WorkloadSpec("empirical:arxiv-sum", num_requests=50, rate=1.0))
    assert (
        len(resampled) == 50 and max(r.prompt_len + r.output_len for r in resampled.requests) <= 4096 + 4056
    )


@needs_shared
def test_simulate_takes_a_registered_name(tmp_path):
    out = tmp_path / "run"
    proc = kvbench(
        "simulate", "--engine", "paged", "--model", "llama-3-8b", "--trace", "mooncake-conv",
        "--num-requests", "40", "--max-total-len", "8192", "--kv-cache-gib", "4", "--out", str(out),
        env={registry.TRACE_DIR_ENV: str(SHARED), registry.CACHE_DIR_ENV: str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert json.dumps(config).count('"mooncake-conv"') >= 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == summary["num_requests"] > 0
    assert not (tmp_path / "cache").exists()  # resolved from the copies, nothing cached


def test_the_positional_argument_is_named_as_typed(tmp_path):
    proc = kvbench("trace", "stats", "no/such/trace.jsonl", env={}, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: TRACE no/such/trace.jsonl: no such file")
    assert "--trace" not in proc.stderr
    proc = kvbench("trace", "make", "fixed:prompt=4", "--out", str(tmp_path / "t.jsonl"), env={})
    assert proc.returncode == 2 and proc.stderr.startswith("error: SPEC fixed:prompt=4: ")
    proc = kvbench("trace", "convert", "no/such.jsonl", str(tmp_path / "t.csv"), env={})
    assert proc.returncode == 2
    assert proc.stderr == "error: TRACE no/such.jsonl: no such file or registered trace\n"
    proc = kvbench("trace", "plot", "fixed:prompt=4,output=oops", "--out", str(tmp_path / "p.png"), env={})
    assert (
        proc.returncode == 2
        and proc.stderr.startswith("error: TRACE fixed:")
        and "--trace" not in proc.stderr
    )


def test_trace_list_says_where_each_copy_is(tmp_path):
    proc = kvbench("trace", "list", env={registry.CACHE_DIR_ENV: str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == list(registry.TRACES)
    assert all(line.endswith("not here: kvbench trace fetch " + line.split(":")[0]) for line in lines)
