"""Inputs that once crashed a command or ran it on a silently wrong value: each is now either
refused in one `error:` line naming the flag the user typed (exit code 2, nothing written) or,
where kvbench can repair what it finds in its own folder, handled and said.

Cases run through `kvbench.cli.app.main` in this process, as in test_bad_flags.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_bad_flags import kvbench

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
