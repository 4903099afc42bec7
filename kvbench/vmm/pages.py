"""How many tokens one physical page holds, and how many pages a byte budget buys.

The driver maps memory in pages of a fixed size (its allocation granularity: 2 MiB on the
H200; vAttention's 64 KiB pages need a modified driver, so kvbench only simulates them). What
a page holds depends on how the virtual ranges lay out the K/V:

- `per-layer` (vAttention's): one virtual tensor per layer for K and one for V; a request's
  range in each holds its tokens of that layer. Growing a request maps one page in each of the
  2 x layers tensors at once: a *page group*, holding `page_bytes / (kv_heads x head_dim x
  dtype bytes)` tokens.
- `per-request`: one virtual range per request holding every layer's K and V of its tokens
  together; a page holds `page_bytes / kv_bytes_per_token` tokens, far fewer.

A page must hold whole tokens, so that a range's pages start on token boundaries and no token
straddles memory another request may own: where `page_bytes` does not divide into whole
tokens, the unit of allocation is the fewest driver pages that do (OPT-13B's 10 KiB per token
and layer: 5 pages of 2 MiB per unit, holding 1,024 tokens). That rounding is what `vmm` pays
in internal fragmentation. (A range may also let a token straddle two driver pages, both mapped
under it; that wastes less than one driver page per tensor and request, and is not modelled.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.errors import KvbenchError
from kvbench.models import ModelSpec

LAYOUTS = ("per-layer", "per-request")
DRIVER_PAGE_BYTES = 2 << 20  # the H200's granularity (results/reference/vmm-probe)


@dataclass(frozen=True)
class PageGeometry:
    layout: str
    driver_page_bytes: int
    driver_pages_per_page: int  # driver pages in one unit of allocation, per virtual tensor
    page_tokens: int  # tokens one unit holds
    page_bytes: int  # physical bytes of one unit (a page group, under per-layer)
    num_pages: int  # whole units the budget holds


def page_geometry(spec: ModelSpec, budget_bytes: int, layout: str, driver_page_bytes: int) -> PageGeometry:
    if layout not in LAYOUTS:
        raise KvbenchError(f"--vmm-layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if driver_page_bytes <= 0 or driver_page_bytes % 4096:
        kib = driver_page_bytes / 1024
        raise KvbenchError(f"--vmm-page-kib must be a positive multiple of 4, got {kib:g}")
    if layout == "per-layer":
        row = spec.num_kv_heads * spec.head_dim * spec.dtype_bytes  # one token of one layer's K
        tensors = 2 * spec.num_layers
    else:
        row, tensors = spec.kv_bytes_per_token, 1
    unit = row // math.gcd(row, driver_page_bytes)  # fewest driver pages holding whole tokens
    page_bytes = unit * driver_page_bytes * tensors
    return PageGeometry(
        layout=layout,
        driver_page_bytes=driver_page_bytes,
        driver_pages_per_page=unit,
        page_tokens=unit * driver_page_bytes // row,
        page_bytes=page_bytes,
        num_pages=budget_bytes // page_bytes,
    )
