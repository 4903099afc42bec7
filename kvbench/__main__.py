"""`python -m kvbench`: the `kvbench` command (what the installed script runs)."""

from kvbench.cli.app import main

main()
