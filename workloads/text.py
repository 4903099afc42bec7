"""Text datasets tokenized offline: ShareGPT, Alpaca, or any local dataset with text columns.

The paper's workloads are ShareGPT and Alpaca *tokenized with the served model's tokenizer*;
lengths then come from real text, and the prompt token ids travel with the trace so a real run
feeds the model real prompts. Nothing is downloaded: the tokenizer is a local directory
(transformers `AutoTokenizer`, `local_files_only`, no remote code) and datasets are local files.

Formats:
- ShareGPT (`ShareGPT_V3_unfiltered_cleaned_split.json`): a JSON list of
  `{"id", "conversations": [{"from": "human"|"gpt", "value": text}, ...]}`. As vLLM's benchmark,
  a request is the first human turn (prompt) and the reply after it (output).
- Alpaca (`alpaca_data.json`): a JSON list of `{"instruction", "input", "output"}`; the prompt is
  the instruction, plus a blank line and the input when there is one.
- Any other local dataset (JSON/JSONL/CSV/Parquet file, or a `save_to_disk` folder) through the
  `datasets` library, with named prompt and response columns. The library runs offline
  (`offline_datasets`): no Hub lookup, and its cache in a temporary folder, not the home folder.

Filtering follows vLLM's ShareGPT benchmark (`TextFilter`): pairs with prompt or output under 4
tokens, a prompt over 1024 or a total over 2048 are skipped and counted (`Trace.meta`), as are
conversations without a reply. With `--no-filter` nothing is skipped and a malformed record is
an error naming the file, record and field.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import Trace
from workloads.columns import Columns, to_trace


@dataclass(frozen=True)
class TextFilter:
    """vLLM's ShareGPT benchmark filter; `enabled=False` keeps every well-formed pair."""

    enabled: bool = True
    min_prompt_len: int = 4
    min_output_len: int = 4
    max_prompt_len: int = 1024
    max_total_len: int = 2048  # OPT's context


@dataclass(frozen=True)
class TextPair:
    prompt: str
    response: str
    record: int  # 0-based index in the file, for errors and provenance


def load_tokenizer(path: str | Path):
    """A local Hugging Face tokenizer directory, never fetched, never running remote code."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise KvbenchError("--tokenizer needs transformers: pip install 'kvbench[text]'") from None
    if not Path(path).is_dir():
        raise KvbenchError(f"--tokenizer {path}: not a directory (a local tokenizer folder is required)")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise KvbenchError(f"--tokenizer {path}: cannot load a tokenizer ({first})") from None


def _read_json_list(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise KvbenchError(f"{path}: no such file") from None
    except json.JSONDecodeError as error:
        raise KvbenchError(f"{path}: invalid JSON at line {error.lineno}, column {error.colno}") from None
    if not isinstance(data, list) or not data:
        raise KvbenchError(f"{path}: expected a non-empty JSON list of records")
    return data


def sharegpt_pairs(path: Path, strict: bool) -> tuple[list[TextPair], int]:
    """First human turn and the reply after it, per conversation; returns (pairs, skipped)."""
    pairs, skipped = [], 0
    for index, record in enumerate(_read_json_list(path)):
        turns = record.get("conversations") if isinstance(record, dict) else None
        ok = (
            isinstance(turns, list)
            and len(turns) >= 2
            and all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns[:2])
        )
        if not ok:
            if strict:
                ident = record.get("id") if isinstance(record, dict) else None
                raise KvbenchError(
                    f"{path}: record {index} (id {ident!r}), column conversations: "
                    "needs a prompt turn and a reply turn with a 'value' text"
                )
            skipped += 1
            continue
        pairs.append(TextPair(turns[0]["value"], turns[1]["value"], index))
    return pairs, skipped


def alpaca_pairs(path: Path, strict: bool) -> tuple[list[TextPair], int]:
    """Instruction (+ input) as prompt, output as response; returns (pairs, skipped)."""
    pairs, skipped = [], 0
    for index, record in enumerate(_read_json_list(path)):
        fields = ("instruction", "output")
        missing = [f for f in fields if not isinstance(record, dict) or not isinstance(record.get(f), str)]
        if missing:
            if strict:
                raise KvbenchError(f"{path}: record {index}, column {missing[0]}: missing or not text")
            skipped += 1
            continue
        extra = record.get("input") or ""
        prompt = record["instruction"] + (f"\n\n{extra}" if extra else "")
        pairs.append(TextPair(prompt, record["output"], index))
    return pairs, skipped


OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
_OFFLINE_FLAGS = (("datasets.config", "HF_HUB_OFFLINE"), ("datasets.config", "HF_DATASETS_OFFLINE"),
                  ("huggingface_hub.constants", "HF_HUB_OFFLINE"))  # fmt: skip


@contextmanager
def offline_datasets() -> Iterator[tuple[object, str]]:
    """The `datasets` module with its offline switches on, and a temporary cache folder.

    `dataset:PATH` is a local file or folder, and the docs promise nothing is downloaded: the
    switches make any Hub lookup fail instead of reaching the network, and the cache (which
    `datasets` otherwise writes under ~/.cache) lives only while the table is read. The
    libraries read the switches from the environment when first imported, and keep them as
    module constants: both are set here, and put back as they were afterwards.
    """
    saved_env = {name: os.environ.get(name) for name in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    saved_flags = []
    try:
        import datasets

        for module_name, flag in _OFFLINE_FLAGS:
            module = importlib.import_module(module_name)
            if hasattr(module, flag):
                saved_flags.append((module, flag, getattr(module, flag)))
                setattr(module, flag, True)
        with tempfile.TemporaryDirectory(prefix="kvbench-datasets-") as cache:
            yield datasets, cache
    finally:
        for module, flag, value in saved_flags:
            setattr(module, flag, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def dataset_pairs(path: Path, prompt_column: str, response_column: str, strict: bool):
    """Pairs from any local dataset the `datasets` library reads (file or saved folder)."""
    if not path.exists():
        raise KvbenchError(f"{path}: no such file or folder (dataset: reads a local file or folder)")
    kind = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}.get(path.suffix)
    if kind is None and not path.is_dir():
        raise KvbenchError(f"{path}: unknown dataset file type (json, jsonl, csv, parquet)")
    if importlib.util.find_spec("datasets") is None:
        raise KvbenchError(f"{path}: reading it needs the datasets library: pip install 'kvbench[text]'")
    with offline_datasets() as (datasets, cache):
        try:
            if path.is_dir():
                table = datasets.load_from_disk(str(path), keep_in_memory=True)
            else:
                table = datasets.load_dataset(
                    kind, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True
                )
        except (OSError, ValueError, datasets.exceptions.DatasetsError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise KvbenchError(f"{path}: the datasets library cannot read it ({first})") from None
    if isinstance(table, datasets.DatasetDict):
        table = table[next(iter(table))]
    for column in (prompt_column, response_column):
        if column not in table.column_names:
            raise KvbenchError(f"{path}: no column {column!r} (columns: {', '.join(table.column_names)})")
    pairs, skipped = [], 0
    for index, (prompt, response) in enumerate(
        zip(table[prompt_column], table[response_column], strict=True)
    ):
        if not isinstance(prompt, str) or not isinstance(response, str):
            if strict:
                bad = prompt_column if not isinstance(prompt, str) else response_column
                raise KvbenchError(f"{path}: record {index}, column {bad}: missing or not text")
            skipped += 1
            continue
        pairs.append(TextPair(prompt, response, index))
    return pairs, skipped


def text_trace(
    pairs: list[TextPair],
    skipped: int,
    tokenizer,
    *,
    name: str,
    where: str,
    num_requests: int | None,
    seed: int,
    text_filter: TextFilter = TextFilter(),
) -> Trace:
    """Tokenize, filter, shuffle with `seed`, keep `num_requests`; arrivals all at 0 (set later)."""
    order = np.random.default_rng(seed).permutation(len(pairs))  # (P,) vLLM samples at random too
    pairs = [pairs[i] for i in order.tolist()]
    prompts = tokenizer([p.prompt for p in pairs], add_special_tokens=True)["input_ids"]
    outputs = tokenizer([p.response for p in pairs], add_special_tokens=False)["input_ids"]
    keep, filtered = [], 0
    f = text_filter
    for index, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        p, o = len(prompt), len(output)
        fits = p >= 1 and o >= 1
        if f.enabled:
            fits = fits and p >= f.min_prompt_len and o >= f.min_output_len
            fits = fits and p <= f.max_prompt_len and p + o <= f.max_total_len
        if fits:
            keep.append(index)
            if num_requests is not None and len(keep) == num_requests:
                break
        else:
            filtered += 1
    if num_requests is not None and len(keep) < num_requests:
        raise KvbenchError(
            f"{where}: only {len(keep)} requests pass the filter, fewer than --num-requests {num_requests}"
        )
    count = len(keep)
    cols = Columns(
        arrival_s=np.zeros(count),
        prompt_len=np.array([len(prompts[i]) for i in keep], dtype=np.int64),
        output_len=np.array([len(outputs[i]) for i in keep], dtype=np.int64),
        lines=np.array([pairs[i].record + 1 for i in keep], dtype=np.int64),
        prompt_ids=[tuple(prompts[i]) for i in keep],
        extra={"skipped_records": skipped, "filtered_pairs": filtered, "timestamps": False},
    )
    return to_trace(cols, name, where)


def text_source(
    kind: str, target: str, tokenizer: str | None, num_requests: int | None, seed: int, filtered: bool
) -> Trace:
    """The trace of a `sharegpt:FILE`, `alpaca:FILE` or `dataset:PATH?prompt=A&response=B` spec."""
    where = f"{kind}:{target}"
    if tokenizer is None:
        raise KvbenchError(f"--trace {where} needs --tokenizer DIR (a local tokenizer folder)")
    path_text, _, query = target.partition("?")
    path = Path(path_text)
    strict = not filtered
    if kind == "sharegpt":
        pairs, skipped = sharegpt_pairs(path, strict)
    elif kind == "alpaca":
        pairs, skipped = alpaca_pairs(path, strict)
    else:
        options = dict(item.partition("=")[::2] for item in query.split("&") if item)
        if "prompt" not in options or "response" not in options:
            raise KvbenchError(
                f"--trace {where}: name the text columns, e.g. dataset:{path}?prompt=q&response=a"
            )
        pairs, skipped = dataset_pairs(path, options["prompt"], options["response"], strict)
    return text_trace(
        pairs, skipped, load_tokenizer(tokenizer), name=path.stem, where=where,
        num_requests=num_requests, seed=seed, text_filter=TextFilter(enabled=filtered),
    )  # fmt: skip
