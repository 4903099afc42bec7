"""Workloads: synthetic length presets and arrival processes that build a ``Trace``."""

from workloads.arrivals import poisson_arrivals
from workloads.presets import PRESETS, LengthFilter, LengthPreset, make_trace

__all__ = ["PRESETS", "LengthFilter", "LengthPreset", "make_trace", "poisson_arrivals"]
