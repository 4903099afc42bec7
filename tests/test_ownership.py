"""Replacing a result replaces kvbench's files only (kvbench/results/ownership.py).

A user's notes inside a run folder, a figure of their own in a report's plots/, a spreadsheet among
a sweep's cells: each command that rewrites the folder is run over them, and each file must be
where the user left it, with its bytes, afterwards. A folder kvbench only seems to have written (a
user's own report.md, reproduce.md, demo.json) is refused before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.results.ownership import carry_foreign, foreign, remove_owned
from tests.test_outputs import SIMULATE, kvbench, one_line_error, snapshot

NOTES = {"notes.txt": "my notes\n", "analysis/a.txt": "mine\n", ".hidden": "dot\n"}


def plant(folder: Path, files: dict[str, str] = NOTES) -> None:
    for relative, text in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)


def still_there(folder: Path, files: dict[str, str] = NOTES) -> None:
    for relative, text in files.items():
        assert (folder / relative).read_text() == text, relative


def test_overwriting_a_run_keeps_what_the_user_put_in_it(tmp_path):
    out = tmp_path / "run"
    assert kvbench(*SIMULATE, "--out", str(out)).exit_code == 0
    plant(out)
    (out / "steps.csv.gz").write_bytes(b"an older packed copy of kvbench's own table")
    result = kvbench(*SIMULATE, "--seed", "3", "--overwrite", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["workload"]["seed"] == 3
    still_there(out)
    assert not (out / "steps.csv.gz").exists()  # a run's table is kvbench's, packed or not
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no old copy or temporary left


def test_a_report_keeps_a_users_figure_and_drops_its_own_stale_ones(tmp_path):
    run, report = tmp_path / "run", tmp_path / "report"
    assert kvbench(*SIMULATE, "--out", str(run)).exit_code == 0
    assert kvbench("report", str(run), "--out", str(report)).exit_code == 0
    marker = json.loads((report / "kvbench.json").read_text())
    assert marker["kind"] == "report" and "report.html" in marker["files"]
    drawn = sorted(p.name for p in (report / "plots").iterdir())
    assert drawn and all(f"plots/{name}" in marker["files"] for name in drawn)
    plant(report, {"plots/mine.png": "my figure\n", "notes.txt": "n\n"})
    stale = report / "plots" / drawn[0]
    stale.rename(report / "plots" / "figure_no_longer_drawn.png")  # listed under another name: fake it
    marker["files"].append("plots/figure_no_longer_drawn.png")
    (report / "kvbench.json").write_text(json.dumps(marker))
    assert kvbench("report", str(run), "--out", str(report)).exit_code == 0
    still_there(report, {"plots/mine.png": "my figure\n", "notes.txt": "n\n"})
    assert not (report / "plots" / "figure_no_longer_drawn.png").exists()
    assert sorted(p.name for p in (report / "plots").iterdir()) == sorted([*drawn, "mine.png"])


@pytest.mark.parametrize(
    "command, files",
    [
        (("report", "{run}"), {"report.html": "<html>mine</html>\n", "report.md": "# my report\n"}),
        (("reproduce", "fig13", "--quick", "--mode", "simulate", "--num-requests", "20"),
         {"reproduce.md": "# my reproduction notes\n"}),
        (("demo", "--mode", "simulate", "--num-requests", "20"), {"demo.json": '{"mine": 1}\n'}),
        (("sweep", "--engines", "paged", "--num-requests", "20", "--resume"), {"sweep.json": "{}\n"}),
    ],
)  # fmt: skip
def test_a_users_folder_named_like_kvbenchs_is_refused_untouched(command, files, tmp_path):
    run = tmp_path / "run"
    assert kvbench(*SIMULATE, "--out", str(run)).exit_code == 0
    mine = tmp_path / "mine"
    plant(mine, {**files, "paged/mine.txt": "x\n"})
    before = snapshot(mine)
    args = [arg.format(run=run) for arg in command]
    one_line_error(kvbench(*args, "--out", str(mine)), f"--out {mine}", "did not write")
    assert snapshot(mine) == before


def test_a_demo_over_a_users_engine_folder_is_refused_before_any_run(tmp_path):
    demo = tmp_path / "demo"
    args = ("demo", "--mode", "simulate", "--num-requests", "20", "--out", str(demo))
    assert kvbench(*args).exit_code == 0
    (demo / "paged" / "summary.json").unlink()  # no longer a run: what is left is the user's
    plant(demo / "paged", {"mine.txt": "x\n"})
    plant(demo / "report", {"kvbench.json": "{}\n"})
    before = snapshot(demo)
    one_line_error(kvbench(*args), f"{demo / 'paged'}", "did not write")
    assert snapshot(demo) == before


def test_overwriting_a_sweep_keeps_what_the_user_put_among_its_cells(tmp_path):
    out = tmp_path / "sweep"
    args = ("sweep", "--engines", "paged", "--num-requests", "20", "--kv-cache-gib", "2", "--out", str(out))
    assert kvbench(*args).exit_code == 0
    cell = next(p for p in (out / "cells").iterdir() if p.is_dir())
    plant(out, {"cells/sheet.csv": "a,b\n", "my-plots/x.txt": "x\n"})
    plant(cell, {"mine.txt": "mine\n"})
    result = kvbench(*args, "--rates", "1", "--overwrite")
    assert result.exit_code == 0, result.output
    still_there(out, {"cells/sheet.csv": "a,b\n", "my-plots/x.txt": "x\n"})
    still_there(cell, {"mine.txt": "mine\n"})
    assert sorted(p.name for p in cell.iterdir()) == ["mine.txt"]  # the old cell's run files went


def test_ownership_by_name_temporaries_and_empty_folders(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    plant(old, {"summary.json": "{}", "config.json": "{}", "requests.csv.gz": "", "kvbench.json": "{}",
                ".steps.csv.kvbench-12-ab12": "", "mine.csv": "m", "sub/summary.json": "u"})  # fmt: skip
    (old / "empty").mkdir()
    plant(new, {"summary.json": "{}", "mine.csv": "new"})
    # a summary.json alone does not make sub/ a run: it is the user's
    assert foreign(old) == ["empty", "mine.csv", "sub/summary.json"]
    assert foreign(old, new) == ["empty", "sub/summary.json"]  # mine.csv: a path kvbench writes now
    assert carry_foreign(old, new) == ["empty", "sub/summary.json"]
    assert (new / "sub" / "summary.json").read_text() == "u" and (new / "empty").is_dir()
    ours = tmp_path / "ours"
    plant(ours, {"summary.json": "{}", "config.json": "{}", "steps.csv": "", ".c.kvbench-7-ab/f": ""})
    remove_owned(ours)
    assert not ours.exists()
    sweep = tmp_path / "sweep"
    plant(sweep, {"cells/c1/summary.json": "{}", "cells/c1/config.json": "{}", "cells/c1/x.txt": "x"})
    (sweep / "cells" / "mine").mkdir()
    remove_owned(sweep / "cells")
    assert sorted(p.relative_to(sweep).as_posix() for p in sweep.rglob("*")) == [
        "cells", "cells/c1", "cells/c1/x.txt", "cells/mine",
    ]  # fmt: skip


def test_a_trace_plot_is_named_png_or_svg(tmp_path):
    for name in ("figure.jpg", "figure"):
        one_line_error(
            kvbench("trace", "plot", "sharegpt-paper", "--out", str(tmp_path / name)), ".png or .svg"
        )
    assert not list(tmp_path.iterdir())


def test_a_real_demo_without_a_gpu_leaves_nothing_behind(tmp_path):
    from kvbench.cli.options import has_cuda

    if has_cuda():
        pytest.skip("a GPU is here: the real demo would run")
    out = tmp_path / "demo"
    one_line_error(kvbench("demo", "--mode", "real", "--out", str(out)), "--mode real")
    assert not out.exists()


def copied_run(source: Path, into: Path) -> dict[str, str]:
    """A run folder a user copied to `into` (their own copy, as `cp -r` makes it): its files."""
    files = {p.relative_to(source).as_posix(): p.read_text() for p in source.rglob("*") if p.is_file()}
    plant(into, files)
    assert {"summary.json", "config.json", "steps.csv", "requests.csv"} <= set(files)
    return files


@pytest.mark.parametrize("where", ["run", "report", "demo"])
def test_a_run_a_user_copied_into_a_result_is_theirs_when_the_result_is_rewritten(where, tmp_path):
    """Only the folder kvbench replaces is a run of its own: a run folder below it (a copy a user
    keeps beside their notes) holds the user's files, whatever their names, and stays whole."""
    source = tmp_path / "source"
    assert kvbench(*SIMULATE, "--out", str(source)).exit_code == 0
    rewrite = {
        "run": (tmp_path / "run", (*SIMULATE, "--overwrite", "--out", str(tmp_path / "run"))),
        "report": (tmp_path / "report", ("report", str(source), "--out", str(tmp_path / "report"))),
        "demo": (
            tmp_path / "demo" / "paged",
            ("demo", "--mode", "simulate", "--num-requests", "20", "--out", str(tmp_path / "demo")),
        ),
    }
    folder, args = rewrite[where]
    assert kvbench(*args).exit_code == 0
    files = copied_run(source, folder / "kept")
    result = kvbench(*args)
    assert result.exit_code == 0, result.output
    still_there(folder / "kept", files)
    assert sorted(p.relative_to(folder / "kept").as_posix() for p in (folder / "kept").rglob("*")) == sorted(
        {*files, *(str(Path(f).parent) for f in files if "/" in f)}
    )


def test_ownership_of_nested_runs_is_the_callers_to_say(tmp_path):
    """`foreign` counts a run's files as kvbench's in the folder replaced; below it only where the
    caller says kvbench writes runs there (a sweep's cells/, through `remove_owned`)."""
    old = tmp_path / "old"
    plant(old, {"summary.json": "{}", "config.json": "{}", "steps.csv": "",
                "copy/summary.json": "{}", "copy/config.json": "{}", "copy/steps.csv": ""})  # fmt: skip
    assert foreign(old) == ["copy/config.json", "copy/steps.csv", "copy/summary.json"]
    assert foreign(old, nested_runs=True) == []
    assert foreign(old / "copy") == []
