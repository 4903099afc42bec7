"""Write docs/reference/CLI.md, every command and option of `kvbench`, from the typer app itself.

The reference is generated, never typed, so it cannot drift from the code: `kvbench.cli.app.app`
is turned into its click command tree (`typer.main.get_command`) and walked; each command's
help, arguments and options (type, default, help, grouped by help panel) become Markdown.
tests/test_docs_generated.py renders it again in memory and fails on any difference.

    python tools/cli_reference.py            # rewrite docs/reference/CLI.md
    python tools/cli_reference.py --check    # exit 1 if the file is out of date

Only attributes click and typer's own copy of click share are read (`opts`, `default`, `help`,
...), and types come from the command's signature, so the output does not depend on which of
the two a typer version ships.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import types
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "reference" / "CLI.md"
COMMAND = "python tools/cli_reference.py"

TYPE_NAMES = {bool: "flag", int: "integer", float: "number", str: "text", Path: "path"}


def type_name(annotation) -> str:
    """The value a parameter takes, in words, from its annotation (`Annotated[int | None, ...]`)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        (annotation,) = (a for a in typing.get_args(annotation) if a is not type(None))
        return type_name(annotation)
    if origin is list:
        return f"{type_name(typing.get_args(annotation)[0])}, repeatable"
    if annotation not in TYPE_NAMES:
        raise TypeError(f"no name for the option type {annotation!r}: add it to TYPE_NAMES")
    return TYPE_NAMES[annotation]


def cell(text: str) -> str:
    """One Markdown table cell: a single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def default_text(param) -> str:
    if param.required:
        return "required"
    if getattr(param, "is_flag", False) and isinstance(param.default, bool):
        return "on" if param.default else "off"
    if param.default is None or param.default == []:
        return ""
    return f"`{param.default}`"


def option_names(param) -> str:
    return " / ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))


def argument_name(param) -> str:
    name = param.metavar or param.name.upper()
    return f"{name}..." if param.nargs == -1 else name


def usage(path: list[str], params: list) -> str:
    arguments = [p for p in params if p.param_type_name == "argument"]
    words = [*path, "[OPTIONS]"]
    for argument in arguments:
        name = argument_name(argument)
        words.append(name if argument.required else f"[{name}]")
    return " ".join(words)


def command_help(command) -> str:
    """The command's docstring as paragraphs (click's `\\b` no-rewrap markers dropped)."""
    text = inspect.cleandoc(command.help or "")
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b")


def render_command(path: list[str], command) -> list[str]:
    signature = inspect.signature(command.callback, eval_str=True).parameters
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    lines = [f"## {' '.join(path)}", ""]
    if command.short_help:
        lines += [f"*{command.short_help}*", ""]
    lines += ["```", usage(path, params), "```", ""]
    if command.help:
        lines += [command_help(command), ""]
    arguments = [p for p in params if p.param_type_name == "argument"]
    if arguments:
        lines += ["| argument | type | meaning |", "|---|---|---|"]
        for p in arguments:
            kind = type_name(signature[p.name].annotation)
            lines.append(f"| `{cell(argument_name(p))}` | {kind} | {cell(p.help or '')} |")
        lines.append("")
    panels: dict[str, list] = {}
    for p in params:
        if p.param_type_name == "option":
            panels.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(p)
    for panel, options in panels.items():
        lines += [f"**{panel}**", "", "| option | type | default | meaning |", "|---|---|---|---|"]
        for p in options:
            kind = type_name(signature[p.name].annotation)
            lines.append(f"| {option_names(p)} | {kind} | {cell(default_text(p))} | {cell(p.help or '')} |")
        lines.append("")
    return lines


def commands(group, path: list[str]):
    """(path, command) of every command under `group`, depth first, in registration order."""
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        if hasattr(command, "commands"):
            yield from commands(command, [*path, name])
        else:
            yield [*path, name], command


def render() -> str:
    """docs/reference/CLI.md as it should read for the code as it is."""
    import typer.main

    from kvbench.cli.app import app

    root = typer.main.get_command(app)
    found = list(commands(root, ["kvbench"]))
    lines = [
        "# Command-line reference",
        "",
        f"<!-- Generated from kvbench.cli.app by {COMMAND}; edit the code, then rerun it. -->",
        "",
        cell(root.help or ""),
        "",
        "Every command prints this with `--help`. A flag shown as `--x` / `--no-x` is on or off;",
        "bad input stops with one `error: ...` line naming the parameter, and exit code 2.",
        "",
    ]
    for path, command in found:
        lines.append(f"- [`{' '.join(path)}`](#{'-'.join(path)}): {cell(command.short_help or '')}")
    lines.append("")
    for path, command in found:
        lines += render_command(path, command)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    text = render()
    if args.check:
        current = TARGET.read_text() if TARGET.is_file() else ""
        if current != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    from kvbench.results.files import write_text

    TARGET.parent.mkdir(parents=True, exist_ok=True)
    write_text(TARGET, text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
