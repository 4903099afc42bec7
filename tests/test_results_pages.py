"""docs/results/ is what tools/results_pages.py makes of the committed result folders.

The pages are generated, never typed: this regenerates every page in memory from results/ and
fails on any difference, naming the command that rewrites them. It also checks that the
generator reads what the folders hold (a number changed in a folder changes its page) and that
every committed result folder has a README whose provenance table the pages can read.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "results"


@pytest.fixture(scope="module")
def pages_module():
    spec = importlib.util.spec_from_file_location("results_pages", ROOT / "tools" / "results_pages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_committed_pages_are_what_the_folders_give(pages_module):
    pages = pages_module.render()
    committed = {path.name for path in PAGES.glob("*.md")}
    assert committed == set(pages), (
        f"docs/results/ holds {sorted(committed)}, the generator makes {sorted(pages)}: "
        f"run {pages_module.REGENERATE}"
    )
    for name, text in pages.items():
        assert (PAGES / name).read_text(encoding="utf-8") == text, (
            f"docs/results/{name} differs from the result folders: run {pages_module.REGENERATE}"
        )


def test_generated_blocks_of_the_docs_are_what_the_folders_give(pages_module):
    """docs/REPRODUCTION.md's numbers on the committed runs sit in generated blocks."""
    import results_pages_docs as docs

    for path, text in docs.render_docs().items():
        assert (ROOT / path).read_text(encoding="utf-8") == text, (
            f"{path}'s generated blocks differ from the result folders: run {pages_module.REGENERATE}"
        )
    reproduction = (ROOT / "docs/REPRODUCTION.md").read_text(encoding="utf-8")
    assert "| `opt-13b` | 12 GiB | 15,728 |" in reproduction
    # a block's body is replaced whole, the prose around it kept; a missing block is an error
    start, end = docs.START.format(name="x"), docs.END.format(name="x")
    filled = docs.fill(f"before\n{start}\nstale 1.0\n{end}\nafter\n", {"x": lambda: "fresh 2.0"}, "d.md")
    assert filled == f"before\n{start}\nfresh 2.0\n{end}\nafter\n"
    with pytest.raises(SystemExit, match="no generated block 'x'"):
        docs.fill("no markers\n", {"x": lambda: ""}, "d.md")


def test_rendering_does_not_follow_the_hash_seed():
    """Two interpreters with different string hashes render the same text, page by page and in
    the same order (a page built by walking a set would differ between them, not within one)."""
    script = (
        "import importlib.util, json, sys; "
        "spec = importlib.util.spec_from_file_location('results_pages', 'tools/results_pages.py'); "
        "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m); "
        "print(json.dumps([list(m.render().items()), list(m.render_docs().items())]))"
    )
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert len(outputs[0][0]) == 6 and outputs[0] == outputs[1]


def test_a_number_in_a_folder_reaches_its_page(pages_module, tmp_path, monkeypatch):
    """The pages read the folders: a changed token-state share shows up on the reproduction page."""
    copy = tmp_path / "repo"
    for folder in ("results/reproduce", "results/reference"):
        shutil.copytree(ROOT / folder, copy / folder, copy_function=os.symlink)  # links: fast
    figure = copy / "results/reproduce/quick-real/fig2/figure.csv"
    text = figure.read_text(encoding="utf-8")
    figure.unlink()  # the link only: the committed file stays as it is
    assert "fig2,paged,sharegpt-paper,token_states_%," in text
    lines = [
        "fig2,paged,sharegpt-paper,token_states_%,12.3456,96.3,"
        if line.startswith("fig2,paged,sharegpt-paper,token_states_%,")
        else line
        for line in text.splitlines()
    ]
    figure.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(pages_module.common, "ROOT", copy)
    page = pages_module.render()["reproduction.md"]
    row = next(
        line for line in page.splitlines() if line.startswith("| sharegpt-paper | paged | `token_states_%` |")
    )
    cells = row.split(" | ")
    assert cells[3] == "96.3"  # the paper
    assert cells[5] == "12.3"  # real OPT-125M: the changed folder
    assert cells[4] == "97.3"  # the simulated run, another folder, as committed


def test_the_calibration_table_gives_loaded_and_unloaded_runs_apart(pages_module):
    """A pooled count lets unloaded runs (throughput = arrival rate whatever the step times)
    lift the held-out score: the table has a row per load, loaded first, never the pooled one."""
    import results_pages_figures as figures

    def errors(runs: int, median: float, largest: float, within: int) -> dict:
        return {"runs": runs, "median_abs_error": median, "max_abs_error": largest, "within_target": within}

    spread = errors(5, 0.02, 0.3, 4) | {
        "loaded": errors(3, 0.05, 0.3, 2),
        "unloaded": errors(2, 0.001, 0.002, 2),
    }
    rows = figures.held_out_rows({"label": "Figures 12-13", "summary": {"normalized_latency_s": spread}})
    assert rows == [
        ["Figures 12-13", "loaded", "`normalized_latency_s`", 3, "5.0", "30.0", "2 of 3"],
        ["Figures 12-13", "unloaded", "`normalized_latency_s`", 2, "0.1", "0.2", "2 of 2"],
    ]
    old = {
        "label": "Figures 14-17",
        "summary": {"normalized_latency_s": {k: spread[k] for k in list(spread)[:4]}},
    }
    assert [row[3:] for row in figures.held_out_rows(old)] == [
        [0, "-", "-", "0 of 0"]
    ] * 2  # not the pooled 5
    page = pages_module.render()["reproduction.md"]
    opt13b = [
        line.split(" | ")
        for line in page.splitlines()
        if line.startswith("| real OPT-13B, 15,728 slots | Figures")
    ]
    assert [row[2] for row in opt13b] == ["loaded"] * 3 + ["unloaded"] * 3
    sets = json.loads((ROOT / "results/reproduce/opt-13b-h200/calibration/held_out_sets.json").read_text())
    throughput = sets["held_out_sets"][0]["summary"]["output_token_throughput"]
    assert opt13b[0][4:] == [str(throughput["loaded"]["runs"]), "1.3", "13.5", "92 of 93 |"]
    assert opt13b[3][4] == str(throughput["unloaded"]["runs"]) and "123" not in {row[4] for row in opt13b}


def test_every_result_folder_has_a_readme_with_provenance(pages_module):
    folders = [p for p in (ROOT / "results/reference").iterdir() if p.is_dir()]
    folders += [p for p in (ROOT / "results/reproduce").iterdir() if p.is_dir()]
    assert folders
    for folder in sorted(folders):
        fields = pages_module.common.readme_fields(folder)
        missing = {"measures", "command", *pages_module.common.PROVENANCE_KEYS} - set(fields)
        assert not missing, f"{folder.relative_to(ROOT)}/README.md: no {sorted(missing)} in its field table"


def test_check_mode_passes_the_committed_pages_and_names_a_changed_one(
    pages_module, tmp_path, monkeypatch, capsys
):
    """--check compares each page's text, not only that it exists: the committed pages pass, and a
    page one character off is named with the command that rewrites it; nothing is written."""
    copy = tmp_path / "repo"
    for folder in ("results/reproduce", "results/reference", "results/mutation"):
        shutil.copytree(ROOT / folder, copy / folder, copy_function=os.symlink)  # links: fast
    shutil.copytree(ROOT / "docs", copy / "docs")
    monkeypatch.setattr(pages_module.common, "ROOT", copy)
    assert pages_module.main(["--check"]) == 0
    assert capsys.readouterr().out == ""
    page = copy / pages_module.PAGES_DIR / "reproduction.md"
    page.write_text(page.read_text(encoding="utf-8") + " ", encoding="utf-8")
    assert pages_module.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"{page.relative_to(copy)} differs from the result folders: run {pages_module.REGENERATE}"
    ]
    assert page.read_text(encoding="utf-8").endswith(" ")


def test_a_number_in_a_benchmark_table_reaches_its_doc(pages_module, tmp_path, monkeypatch):
    """docs/HYBRID.md's tables read the rows their benchmarks wrote: a changed mean shows up."""
    import results_pages_docs as docs

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "results/reference", copy / "results/reference", copy_function=os.symlink)
    table = copy / "results/reference/hybrid-occupancy-sim/table.md"
    text = table.read_text(encoding="utf-8")
    table.unlink()  # the link only: the committed file stays as it is
    assert "| arxiv-sum (12) | paged | 12.5 ± 0.0 |" in text
    table.write_text(
        text.replace("| arxiv-sum (12) | paged | 12.5 ± 0.0 |", "| arxiv-sum (12) | paged | 99.9 ± 0.0 |")
    )
    monkeypatch.setattr(pages_module.common, "ROOT", copy)
    rows = docs.hybrid_sim_table().splitlines()
    assert "| arxiv-sum (12 req/s) | paged | 99.9 | 3.09 | 43.0 |" in rows
    assert "| arxiv-sum (12 req/s) | hybrid | 22.3 | 3.91 | 2.6 |" in rows  # the others as committed
    real = docs.hybrid_real_table()  # another folder of the copy, untouched
    assert "| arxiv-sum (40 req.) | hybrid | 2 | 21.7 | 87.5 | 1.093 ± 0.031 |" in real


def test_a_failed_repeat_reaches_the_testing_doc(pages_module, tmp_path, monkeypatch):
    """docs/TESTING.md's repeat counts are runs.csv's: one run marked failed is one green fewer."""
    import results_pages_docs as docs

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "results/reference", copy / "results/reference", copy_function=os.symlink)
    runs = copy / "results/reference/test-repeats/runs.csv"
    lines = runs.read_text(encoding="utf-8").splitlines()
    runs.unlink()  # the link only: the committed file stays as it is
    first_idle = next(i for i, line in enumerate(lines) if ",False," in line and line.endswith(",True"))
    lines[first_idle] = lines[first_idle].removesuffix(",True") + ",False"
    runs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    committed = docs.test_repeats_sentence()
    monkeypatch.setattr(pages_module.common, "ROOT", copy)
    changed = docs.test_repeats_sentence()
    idle = sum(",False," in line for line in lines[1:])
    assert f"idle {idle}/{idle} green" in committed
    assert f"idle {idle - 1}/{idle} green" in changed
    assert changed.split("loaded ")[1] == committed.split("loaded ")[1]  # the loaded lanes as committed


def test_the_results_index_lists_every_result_folder():
    """results/README.md is where a reader finds a folder: one missing from it is as good as lost."""
    index = (ROOT / "results/README.md").read_text()
    for kind in ("reference", "reproduce"):
        for folder in sorted(p for p in (ROOT / "results" / kind).iterdir() if p.is_dir()):
            listed = f"]({kind}/{folder.name}/README.md)" in index
            assert listed, f"results/README.md does not list {kind}/{folder.name}"
