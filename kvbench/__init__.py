"""kvbench: how KV-cache allocation strategies change what one GPU can serve."""

__version__ = "0.1.0"
