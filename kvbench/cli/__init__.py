"""The `kvbench` command line: one module per command group, options shared in `options`.

The typer app lives in `app`; nothing below the command line imports from here.
"""
