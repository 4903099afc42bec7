"""How many tokens one physical page holds, and how many pages a byte budget buys.

The driver maps memory in pages of a fixed size (its allocation granularity: 2 MiB on the
H200, results/reference/vmm-probe; vAttention's 64 KiB pages need a modified driver, so kvbench
only simulates them). What a page holds depends on how the virtual ranges lay out the K/V:

- `per-layer` (vAttention's): one virtual tensor per layer for K and one for V; a request's
  range in each holds its tokens of that layer. Growing a request maps one page in each of the
  2 x layers tensors at once (a page group), holding `page_bytes / (kv_heads x head_dim x dtype
  bytes)` tokens: 1,024 for Llama-3-8B's 2 KiB per token and layer, 204.8 for OPT-13B's 10 KiB.
  An MLA model (DeepSeek-V2) keeps one latent per token and layer in place of K and V: one
  tensor per layer, a page holding `page_bytes / latent bytes` tokens (1,820.4 for
  DeepSeek-V2-Lite's 1,152 bytes).
- `per-request`: one virtual range per request holding every layer's K and V of its tokens
  together; a page holds `page_bytes / kv_bytes_per_token` tokens, far fewer (2.56 for OPT-13B).

A page need not hold whole tokens: a token may straddle two pages of the same range, both
mapped under it, so `page_tokens` is a fraction (`engines.vmm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from kvbench.errors import KvbenchError
from kvbench.models import ModelSpec

LAYOUTS = ("per-layer", "per-request")
DEFAULT_PAGE_KIB = 2048  # the H200's allocation granularity


@dataclass(frozen=True)
class PageGeometry:
    layout: str
    driver_page_bytes: int  # one page of one virtual tensor
    page_tokens: Fraction  # tokens one page (group) holds
    page_bytes: int  # physical bytes of one page (group): a page in every tensor
    num_pages: int  # whole pages (groups) the budget holds


def page_geometry(spec: ModelSpec, budget_bytes: int, layout: str, page_kib: int) -> PageGeometry:
    """Pages of `page_kib` KiB (per virtual tensor) under `layout`; as many as fit the budget's
    bytes and, counted in slots, its `budget_bytes // kv_bytes_per_token` slots (the arena every
    engine of a comparison shares)."""
    if layout not in LAYOUTS:
        raise KvbenchError(f"--vmm-layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if page_kib < 4 or page_kib % 4:
        raise KvbenchError(f"--vmm-page-kib must be a positive multiple of 4, got {page_kib}")
    page = page_kib * 1024
    if layout == "per-layer" and spec.mla is not None:
        # MLA keeps one latent a token and layer in place of K and V: one virtual tensor a layer,
        # so a page holds what the arena's slots hold (sized by K/V heads, it held a fraction)
        row, tensors = spec.full_layer.bytes_per_token, spec.num_layers
    elif layout == "per-layer":
        row = spec.num_kv_heads * spec.head_dim * spec.dtype_bytes  # one token of one layer's K
        tensors = 2 * spec.num_layers
    else:
        row, tensors = spec.kv_bytes_per_token, 1
    page_tokens = Fraction(page, row)
    num_slots = budget_bytes // spec.kv_bytes_per_token
    return PageGeometry(
        layout=layout,
        driver_page_bytes=page,
        page_tokens=page_tokens,
        page_bytes=page * tensors,
        num_pages=min(budget_bytes // (page * tensors), int(num_slots / page_tokens)),
    )
