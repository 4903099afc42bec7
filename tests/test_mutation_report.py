"""tools/mutation.py rewrites a scope's report, not the survivors explained by hand beside it."""

from __future__ import annotations

from tests.support import load_script


def test_a_new_report_keeps_the_files_a_run_does_not_write(tmp_path):
    mutation = load_script("tools/mutation.py")
    out = tmp_path / "scope"
    out.mkdir()
    (out / "equivalent.md").write_text("# why these survive\n")
    (out / "survivors.md").write_text("old\n")
    run = {
        "paths": ["x.py"],
        "commit": "abc",
        "date": "today",
        "command": "c",
        "finished": True,
        "seconds": 1,
    }
    mutation.write_report(out, run, {"killed": 1, "total": 2}, [("x.m_1", "- a\n+ b")])
    assert (out / "equivalent.md").read_text() == "# why these survive\n"
    assert "## x.m_1" in (out / "survivors.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == [
        "equivalent.md",
        "run.json",
        "stats.json",
        "survivors.md",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
