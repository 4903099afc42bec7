"""The public traces kvbench knows by name: where each lives upstream, pinned, and how to get it.

A name (`--trace azure-conv`) stands for one upstream file at one commit, identified by its
sha256, so every machine that resolves the name replays the same bytes. Resolution never touches
the network:

1. `KVBENCH_TRACE_DIR/<local>`: a folder of copies for offline machines and CI, laid out as
   `azure2023/AzureLLMInferenceTrace_conv.csv`, `mooncake/conversation_trace.jsonl`, ...;
2. the cache, `<cache>/<local>`, filled by `kvbench trace fetch` (the one command that downloads);
3. otherwise one line saying to run `kvbench trace fetch NAME` or set `KVBENCH_TRACE_DIR`.

A copy found is checked against its sha256 once per process (a different file under a known
name would silently change every result). The cache is `KVBENCH_CACHE_DIR/traces`, else the
platform's user cache folder (`~/.cache/kvbench/traces` on Linux). A download streams into a
temporary file beside its target, is hashed on the way, and is renamed into place only when the
size and sha256 match: a wrong or truncated file leaves nothing behind.

The facts (repository, commit, path, sha256, license, citation) are those of the copies in the
project's shared/traces/SOURCES.md; the Azure code trace's were read from the repository's own
history at the same commit as the conversation trace.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import KvbenchError

BASE_URL = "https://raw.githubusercontent.com"
URL_ENV = "KVBENCH_TRACE_URL"  # base URL of a mirror laid out as BASE_URL: <repo>/<commit>/<path>
TRACE_DIR_ENV = "KVBENCH_TRACE_DIR"
CACHE_DIR_ENV = "KVBENCH_CACHE_DIR"
CHUNK = 1 << 20  # bytes read per network call
TIMEOUT_S = 60  # per blocking network call, not for the whole download


@dataclass(frozen=True)
class PublicTrace:
    """One upstream trace file, pinned to a commit and identified by its sha256."""

    name: str
    repo: str  # GitHub owner/name
    commit: str
    path: str  # inside the repository
    local: str  # relative path under KVBENCH_TRACE_DIR and the cache
    sha256: str
    size: int  # bytes
    license: str
    citation: str
    about: str

    def url(self, base: str | None = None) -> str:
        """The file's raw URL at its commit, under `base` (default: KVBENCH_TRACE_URL or GitHub's)."""
        base = base or os.environ.get(URL_ENV) or BASE_URL
        if not base.startswith(("https://", "http://", "file://")):
            raise KvbenchError(f"{URL_ENV} must be an http(s):// or file:// URL, got {base!r}")
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{self.path}"


_AZURE_REPO, _AZURE_COMMIT = "Azure/AzurePublicDataset", "790921015d50dd6aae7f7e47f39ba0e235ad6b08"
_SPLITWISE = 'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024'

TRACES: dict[str, PublicTrace] = {
    t.name: t
    for t in (
        PublicTrace(
            name="azure-conv",
            repo=_AZURE_REPO,
            commit=_AZURE_COMMIT,
            path="data/AzureLLMInferenceTrace_conv.csv",
            local="azure2023/AzureLLMInferenceTrace_conv.csv",
            sha256="2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
            size=719_188,
            license="CC-BY-4.0",
            citation=_SPLITWISE,
            about="Azure LLM inference 2023, conversation: 19,366 requests over one hour, real arrivals",
        ),
        PublicTrace(
            name="azure-code",
            repo=_AZURE_REPO,
            commit=_AZURE_COMMIT,
            path="data/AzureLLMInferenceTrace_code.csv",
            local="azure2023/AzureLLMInferenceTrace_code.csv",
            sha256="54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
            size=320_117,
            license="CC-BY-4.0",
            citation=_SPLITWISE,
            about="Azure LLM inference 2023, code: 8,819 requests over the same hour, real arrivals",
        ),
        PublicTrace(
            name="arxiv-sum",
            repo="microsoft/vidur",
            commit="6d98aa8f71696520acc603d87439e77cc78160a7",
            path="data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
            local="vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
            sha256="9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc",
            size=884_932,
            license="MIT",
            citation=(
                'Cohan et al., "A Discourse-Aware Attention Model for Abstractive Summarization of Long'
                ' Documents", NAACL 2018 (the dataset); lengths from microsoft/vidur'
            ),
            about="arXiv summarization lengths (Llama-2 tokenizer, total <= 4096): 28,257 rows, no arrivals",
        ),
        PublicTrace(
            name="sharegpt-8k",
            repo="project-etalon/etalon",
            commit="10102d06d17e7763a9779b0483b41abd7fabeb3b",
            path="data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            local="etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            sha256="6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f",
            size=949_600,
            license="Apache-2.0",
            citation="ShareGPT conversation lengths from the project-etalon/etalon repository",
            about=(
                "ShareGPT lengths with conversation history (Llama-2 tokenizer, total <= 8K): 30,731 rows,"
                " no arrivals; not the paper's first-turn ShareGPT"
            ),
        ),
        PublicTrace(
            name="mooncake-conv",
            repo="kvcache-ai/Mooncake",
            commit="3cca71daccf2a7afb8fe3f0295358f70e3a69fdb",
            path="FAST25-release/traces/conversation_trace.jsonl",
            local="mooncake/conversation_trace.jsonl",
            sha256="b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
            size=3_029_533,
            license="Apache-2.0",
            citation=(
                'Qin et al., "Mooncake: A KVCache-centric Disaggregated Architecture for LLM Serving",'
                " FAST 2025"
            ),
            about="Mooncake conversation: 12,031 requests over one hour, 512-token prefix block hashes",
        ),
    )
}


def lookup(name: str) -> PublicTrace:
    """The registered trace `name`, or a one-line error listing the names."""
    if name not in TRACES:
        raise KvbenchError(f"unknown trace {name!r}; registered: {', '.join(TRACES)}")
    return TRACES[name]


def cache_dir() -> Path:
    """Where `kvbench trace fetch` puts traces: KVBENCH_CACHE_DIR/traces or the user cache folder."""
    root = os.environ.get(CACHE_DIR_ENV)
    if root:
        return Path(root).expanduser() / "traces"
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kvbench" / "traces"


def trace_file(source: str) -> Path:
    """The local file behind `source`: a registered name resolved (see the module docstring),
    anything else taken as a path."""
    if source not in TRACES:
        return Path(source)
    trace = TRACES[source]
    path = folder_copy(trace)
    if path is not None:
        return path
    path = cache_dir() / trace.local
    if path.is_file():
        _check_copy(trace, path)
        return path
    folder = os.environ.get(TRACE_DIR_ENV)
    where = f"{TRACE_DIR_ENV}={folder} has no {trace.local}; " if folder else ""
    raise KvbenchError(
        f"trace {trace.name!r} is not here: {where}run `kvbench trace fetch {trace.name}` "
        f"(downloads {trace.size:,} bytes) or set {TRACE_DIR_ENV} to a folder of copies"
    )


def folder_copy(trace: PublicTrace) -> Path | None:
    """KVBENCH_TRACE_DIR's verified copy of `trace`; None where the variable is unset or the
    folder lacks the file (a different file there is an error, not a miss)."""
    folder = os.environ.get(TRACE_DIR_ENV)
    path = Path(folder).expanduser() / trace.local if folder else None
    if path is None or not path.is_file():
        return None
    _check_copy(trace, path)
    return path


_verified: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) of copies already hashed


def _check_copy(trace: PublicTrace, path: Path) -> None:
    """Hash `path` once per process (again if it changes); a mismatch is a one-line error."""
    status = path.stat()
    key = (str(path.resolve()), status.st_size, status.st_mtime_ns)
    if key in _verified:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    if digest.hexdigest() != trace.sha256:
        raise KvbenchError(
            f"{path}: sha256 {digest.hexdigest()} is not {trace.name}'s {trace.sha256} "
            f"(a different file under its name; remove it or fetch it again)"
        )
    _verified.add(key)


def is_cached(trace: PublicTrace) -> bool:
    """Whether the cache holds a verified copy of `trace`."""
    path = cache_dir() / trace.local
    if not path.is_file():
        return False
    try:
        _check_copy(trace, path)
    except KvbenchError:
        return False
    return True


def fetch(trace: PublicTrace, base: str | None = None) -> Path:
    """Download `trace` into the cache unless a verified copy is there; returns its path.

    The bytes stream into a temporary file beside the target, hashed as they arrive; more bytes
    than the registered size stop the download at once. Only a file of the right size and sha256
    is renamed into place; anything else raises a one-line KvbenchError and leaves nothing behind.
    """
    from workloads.tracefile import _write_atomically  # the same atomic write as trace files

    target = cache_dir() / trace.local
    if is_cached(trace):
        return target
    url = trace.url(base)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise KvbenchError(f"{target.parent}: cannot create the trace cache ({error.strerror})") from None
    _write_atomically(target, _download(trace, url), binary=True)
    status = target.stat()  # hashed on the way in: no need to read it again in this process
    _verified.add((str(target.resolve()), status.st_size, status.st_mtime_ns))
    return target


def _download(trace: PublicTrace, url: str) -> Callable:
    """A writer for `_write_atomically` that streams `url` into the file, checking size and sha256."""

    def write(out) -> None:
        digest, size = hashlib.sha256(), 0
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                while block := response.read(CHUNK):
                    size += len(block)
                    if size > trace.size:
                        raise KvbenchError(f"{url}: more than {trace.size:,} bytes; not {trace.name}")
                    digest.update(block)
                    out.write(block)
        except urllib.error.HTTPError as error:
            raise KvbenchError(f"{url}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", None) or error
            raise KvbenchError(f"{url}: cannot download ({reason})") from None
        if size != trace.size or digest.hexdigest() != trace.sha256:
            raise KvbenchError(
                f"{url}: got {size:,} bytes with sha256 {digest.hexdigest()}, expected {trace.size:,}"
                f" bytes with {trace.sha256}; nothing was kept"
            )

    return write
