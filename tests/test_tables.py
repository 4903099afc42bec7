"""Printed numbers and tables: one format per kind of quantity, rich on a terminal, plain elsewhere."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from kvbench.config import RunConfig
from kvbench.report.format import aligned, count, number, percent, show, significant
from kvbench.report.tables import compare
from kvbench.simulate import simulate, write_result
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
TINY = ("--model", "tiny-opt", "--kv-cache-gib", "0.002", "--trace", "uniform:prompt=4..30,output=2..12")


@pytest.mark.parametrize(
    ("kind", "value", "text"),
    [
        (count, 0, "0"),
        (count, 27290, "27,290"),
        (count, 1234567.6, "1,234,568"),
        (count, None, "-"),
        (significant, 27290.474, "27,290"),
        (significant, 4.8576, "4.858"),
        (significant, 2.0, "2.000"),
        (significant, 0.012345678, "0.01235"),
        (significant, 9.99996, "10.00"),  # rounding carries into the next power of ten
        (significant, 0.00000044721, "0.0000004472"),
        (significant, -3.14159, "-3.142"),
        (significant, 0, "0"),
        (significant, float("nan"), "-"),
        (significant, float("inf"), "inf"),
        (percent, 0.1234, "12.3"),
        (percent, 1.0, "100.0"),
        (percent, -0.0001, "0.0"),  # rounding residue is not "-0.0"
        (percent, None, "-"),
        (number, 27290, "27,290"),
        (number, 27290.0, "27,290"),  # an integral float is a count
        (number, 27290.474, "27,290"),
        (number, 0.0123456, "0.01235"),
        (number, True, "True"),
        (number, "paged", "paged"),
    ],
)
def test_each_kind_of_quantity_has_one_format(kind, value, text):
    assert kind(value) == text


def test_no_scientific_notation_at_any_magnitude():
    for exponent in range(-9, 13):
        for mantissa in (1.0, 2.71828, 9.99999):
            value = mantissa * 10.0**exponent
            assert "e" not in significant(value) and "e" not in number(value), value
            assert float(significant(value).replace(",", "")) == pytest.approx(value, rel=5e-4)


TABLE = aligned(["", "paged", "orca-max"], [["engine", "paged", "orca-max"], ["preemptions", "3", "1,204"]])


def test_plain_tables_align_text_left_and_numbers_right():
    assert TABLE == (
        "             paged  orca-max\n"
        "-----------  -----  --------\n"
        "engine       paged  orca-max\n"
        "preemptions      3     1,204"
    )
    assert (TABLE.header, TABLE.rows[1]) == (("", "paged", "orca-max"), ("preemptions", "3", "1,204"))


def test_a_terminal_gets_a_rich_table_of_the_same_cells_and_anything_else_plain_text():
    screen = Console(file=io.StringIO(), force_terminal=True, width=100)
    show(TABLE, console=screen)
    drawn = re.sub(r"\x1b\[[0-9;]*m", "", screen.file.getvalue())
    assert "┃" in drawn and "│ preemptions │     3 │    1,204 │" in drawn, drawn
    for console, stream in ((Console(file=io.StringIO()), None), (None, io.StringIO())):
        show(TABLE, console=console, stream=stream)
        assert (stream or console.file).getvalue() == TABLE + "\n"
    narrow = Console(file=io.StringIO(), force_terminal=True, width=20)
    show(TABLE, console=narrow)  # wider than the terminal: drawn whole, no cell cut short
    assert "1,204" in narrow.file.getvalue() and "…" not in narrow.file.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    workload = WorkloadSpec("uniform:prompt=4..30,output=2..12", num_requests=30, rate=50.0)
    folders = []
    for engine in ("paged", "orca-max"):
        config = RunConfig(engine, model="tiny-opt", workload=workload, kv_cache_gib=0.002)
        write_result(simulate(config), root / engine)
        folders.append(root / engine)
    return folders


RATES_AND_TIMES = ("throughput req/s", "output tok/s", "norm. latency s/tok", "mean TTFT s", "mean TPOT s",
                   "batched mean", "makespan s")  # fmt: skip
COUNTS = ("batched peak", "preemptions", "block size")


def test_compare_formats_each_row_by_its_kind(runs):
    table = compare(runs)
    rows = {row[0]: row[1:] for row in table.rows}
    assert table.header[1:] == ("paged", "orca-max")
    for name, cells in rows.items():
        for cell in cells:
            assert not re.search(r"\de[+-]?\d", cell), (name, cell)  # never scientific
            if name in RATES_AND_TIMES or name.endswith("_s") or name == "goodput":
                assert significant(float(cell.replace(",", ""))) == cell, (name, cell)
            elif name.endswith("%"):
                assert re.fullmatch(r"\d+\.\d", cell), (name, cell)
            elif name in COUNTS:
                assert re.fullmatch(r"\d{1,3}(,\d{3})*", cell), (name, cell)
    assert set(RATES_AND_TIMES + COUNTS) <= set(rows)
    assert any(name.startswith("p99_") for name in rows)  # the optional keys are checked too


def test_compare_off_a_terminal_prints_the_plain_table(runs):
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", "compare", *map(str, runs)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == compare(runs) + "\n"
    assert "\x1b" not in proc.stdout and "┃" not in proc.stdout


def test_simulate_prints_each_quantity_in_its_format(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", "simulate", "--engine", "orca-max", *TINY, "--num-requests", "30",
         "--rate", "50", "--slo", "ttft=1", "--out", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()[0]
    figure = r"(-?[\d,]+(?:\.\d+)?)"
    found = re.fullmatch(
        rf"orca-max: 30/30 requests in {figure} s simulated \({figure} s wall\), {figure} req/s, "
        rf"{figure} batched, normalized latency {figure} s/token, (\d+) preemptions",
        head,
    )
    assert found, head
    for text in found.groups()[:-1]:
        assert significant(float(text.replace(",", ""))) == text, (text, head)
    shares = re.findall(r"[ (]([^ (]+)%", proc.stdout)
    assert shares and all(re.fullmatch(r"\d+\.\d", s) for s in shares), shares
    assert "\x1b" not in proc.stdout
