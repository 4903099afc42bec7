"""Generated docs match the code: docs/reference/CLI.md is what tools/cli_reference.py writes now.

The reference is rendered again in memory from the typer app; any difference (a new option, a
changed help line or default) fails with the command that regenerates the file.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    return load_script("tools/cli_reference.py")


def test_the_cli_reference_is_generated_from_the_app():
    tool = _tool()
    expected = tool.render()
    current = tool.TARGET.read_text() if tool.TARGET.is_file() else ""
    diff = "".join(difflib.unified_diff(
        current.splitlines(keepends=True), expected.splitlines(keepends=True),
        "docs/reference/CLI.md (committed)", "docs/reference/CLI.md (from the code)", n=1,
    ))  # fmt: skip
    if current != expected:
        pytest.fail(f"docs/reference/CLI.md is out of date: run {tool.COMMAND}\n{diff[:4000]}", pytrace=False)


def test_the_reference_names_every_command_and_option_of_the_app():
    """The walk misses nothing: every visible option of `kvbench run` and `kvbench trace make` is listed."""
    import typer.main

    from kvbench.cli.app import app

    root = typer.main.get_command(app)
    text = _tool().render()
    for path in (("run",), ("trace", "make"), ("sweep",), ("calibrate",)):
        command = root
        for name in path:
            command = command.commands[name]
        assert f"## kvbench {' '.join(path)}\n" in text
        section = text.split(f"## kvbench {' '.join(path)}\n")[1].split("\n## ")[0]
        for param in command.params:
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                assert f"| `{param.opts[0]}`" in section, (path, param.opts)
    assert "--num-requests" not in text.split("## kvbench reproduce\n")[1].split("\n## ")[0]  # hidden


def test_type_names_follow_the_annotation():
    from typing import Annotated

    tool = _tool()
    assert tool.type_name(Annotated[int | None, "option"]) == "integer"
    assert tool.type_name(list[Path] | None) == "path, repeatable"
    assert tool.type_name(bool) == "flag"
    assert tool.cell("a|b\n  c") == "a\\|b c"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return found


def test_the_guides_links_resolve():
    """Every relative link of the README and the docs/ guide names a file that exists, and a
    heading of it where it names one."""
    docs = ROOT / "docs"
    pages = [ROOT / "README.md", *sorted(docs.glob("*.md")), *sorted(docs.glob("*/*.md"))]
    broken = []
    for page in pages:
        text = page.read_text()
        for target in LINK.findall(re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_anchors_follow_github():
    assert anchors("# kvbench trace make\n## The demo beside the paper\n### `kvbench trace`\n") == {
        "kvbench-trace-make", "the-demo-beside-the-paper", "kvbench-trace",
    }
