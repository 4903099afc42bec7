"""kvbench's version, recorded in every result's env.json and sweep.json."""

__version__ = "0.1.0"
