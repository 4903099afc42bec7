"""kvbench: how KV-cache allocation strategies change what one GPU can serve."""

import kvbench.external  # noqa: F401  (registers transformers' engines in kvbench.plugins)
from kvbench.version import __version__

__all__ = ["__version__"]
