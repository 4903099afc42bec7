"""Text datasets: a real tokenizer (built here, nothing downloaded) on fixture files."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from kvbench.errors import KvbenchError  # noqa: E402
from workloads.text import (  # noqa: E402
    TextFilter,
    alpaca_pairs,
    dataset_pairs,
    load_tokenizer,
    sharegpt_pairs,
    text_trace,
)

WORDS = "the a cat dog sat on mat ran far away quickly slowly and then it was good bad very".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A word-level tokenizer saved as a local Hugging Face folder: one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tokenizer")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"})
    )
    return load_tokenizer(folder)


def words(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_first_turn_and_reply_with_vllm_filter(tmp_path, tokenizer):
    data = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": words(10)}, {"from": "gpt", "value": words(7)}],
        },
        {
            "id": "b",
            "conversations": [{"from": "human", "value": words(3)}, {"from": "gpt", "value": words(9)}],
        },
        {"id": "c", "conversations": [{"from": "human", "value": words(5)}]},  # no reply: skipped
        {
            "id": "d",
            "conversations": [{"from": "human", "value": words(6)}, {"from": "gpt", "value": words(4)}],
        },
    ]
    pairs, skipped = sharegpt_pairs(write(tmp_path / "sg.json", data), strict=False)
    assert skipped == 1 and [p.record for p in pairs] == [0, 1, 3]
    trace = text_trace(pairs, skipped, tokenizer, name="sg", where="sg.json", num_requests=None, seed=0)
    assert sorted((r.prompt_len, r.output_len) for r in trace.requests) == [(6, 4), (10, 7)]  # b: prompt < 4
    assert trace.meta == {"skipped_records": 1, "filtered_pairs": 1, "timestamps": False}
    for request in trace.requests:
        assert len(request.prompt_ids) == request.prompt_len and 0 not in request.prompt_ids


def test_filter_can_be_turned_off_and_limits_apply(tmp_path, tokenizer):
    data = [
        {"instruction": words(2), "input": "", "output": words(2)},
        {"instruction": words(30), "output": words(40)},
    ]
    pairs, _ = alpaca_pairs(write(tmp_path / "al.json", data), strict=True)
    loose = text_trace(pairs, 0, tokenizer, name="al", where="al.json", num_requests=None, seed=0,
                       text_filter=TextFilter(enabled=False))  # fmt: skip
    assert sorted(r.prompt_len for r in loose.requests) == [2, 30]
    tight = TextFilter(max_prompt_len=20)
    with pytest.raises(KvbenchError, match="only 0 requests pass the filter, fewer than --num-requests 1"):
        text_trace(pairs, 0, tokenizer, name="al", where="al.json", num_requests=1, seed=0, text_filter=tight)


def test_alpaca_prompt_joins_instruction_and_input(tmp_path, tokenizer):
    data = [{"instruction": words(5), "input": words(4), "output": words(6)}]
    pairs, _ = alpaca_pairs(write(tmp_path / "al.json", data), strict=True)
    trace = text_trace(pairs, 0, tokenizer, name="al", where="al.json", num_requests=1, seed=0)
    assert (trace.requests[0].prompt_len, trace.requests[0].output_len) == (9, 6)


def test_seed_shuffles_deterministically(tmp_path, tokenizer):
    data = [{"instruction": words(5 + i), "output": words(5)} for i in range(30)]
    pairs, _ = alpaca_pairs(write(tmp_path / "al.json", data), strict=True)

    def lengths(seed):
        trace = text_trace(pairs, 0, tokenizer, name="al", where="al.json", num_requests=10, seed=seed)
        return [r.prompt_len for r in trace.requests]

    assert lengths(1) == lengths(1) != lengths(2)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            [{"id": "x", "conversations": [{"from": "human", "value": "hi"}]}],
            "record 0 (id 'x'), column conversations",
        ),
        ([{"id": "y", "conversations": "nope"}], "record 0 (id 'y'), column conversations"),
    ],
)
def test_strict_sharegpt_names_the_record_with_missing_turns(tmp_path, data, message):
    with pytest.raises(KvbenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sharegpt_pairs(write(tmp_path / "sg.json", data), strict=True)


def test_strict_alpaca_names_record_and_column(tmp_path):
    data = [{"instruction": "a", "output": "b"}, {"instruction": "a"}]
    with pytest.raises(KvbenchError, match="al.json: record 1, column output: missing or not text"):
        alpaca_pairs(write(tmp_path / "al.json", data), strict=True)


def test_truncated_json_and_empty_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"instruction": "a", "output": ')
    with pytest.raises(KvbenchError, match="bad.json: invalid JSON at line 1"):
        alpaca_pairs(bad, strict=True)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(KvbenchError, match="empty.json: expected a non-empty JSON list"):
        sharegpt_pairs(empty, strict=False)


def test_any_local_dataset_by_column_names(tmp_path, tokenizer):
    pytest.importorskip("datasets")
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps({"q": words(8 + i), "a": words(5)}) for i in range(5)) + "\n")
    pairs, skipped = dataset_pairs(path, "q", "a", strict=True)
    trace = text_trace(pairs, skipped, tokenizer, name="chat", where=str(path), num_requests=5, seed=0)
    assert sorted(r.prompt_len for r in trace.requests) == [8, 9, 10, 11, 12]
    with pytest.raises(KvbenchError, match="no column 'question'"):
        dataset_pairs(path, "question", "a", strict=True)


def test_tokenizer_folder_must_exist(tmp_path):
    with pytest.raises(KvbenchError, match="not a directory"):
        load_tokenizer(tmp_path / "missing")
