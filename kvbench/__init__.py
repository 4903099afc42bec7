"""kvbench: how KV-cache allocation strategies change what one GPU can serve.

Saved results read back as pandas DataFrames: `kvbench.load_run(folder)`,
`kvbench.load_sweep(folder)`, `kvbench.load_runs(folders)` and `kvbench.load_figures(folder)`
(`kvbench.results.load`). They are imported on first use, so `import kvbench` stays light
(no pandas, no torch).
"""

import kvbench.external  # noqa: F401  (registers transformers' engines in kvbench.plugins)
from kvbench.version import __version__

_LOADERS = ("load_run", "load_sweep", "load_runs", "load_figures")

__all__ = ["__version__", *_LOADERS]


def __getattr__(name: str):
    """`kvbench.load_run` and the other loaders, imported when first asked for."""
    if name in _LOADERS:
        from kvbench.results import load

        return getattr(load, name)
    raise AttributeError(f"module 'kvbench' has no attribute {name!r}")
