"""Attention over the KV arena, with the batch's layout passed explicitly (no global state).

Every step first stores the new tokens' K/V at `slot_mapping`, then attends from the arena:

- prefill (varlen): each sequence's new tokens, packed `[T, ...]` with `cu_seqlens`, attend
  causally to all `context_lens[b]` positions their sequence holds (a prefix computed
  earlier included);
- decode: one query per sequence attends to its first `context_lens[b]` positions.

A prefill step may lead with `decode_rows` sequences of one new token each (a chunked-prefill
step's running decodes): on the kernel path those rows run the decode kernel, which splits a
long context over several programs, and the rest the extend kernel, whose one program per
(query tile, head) would read a 1-token row's whole context alone.

Slots come from the engine's addressing: a block table (paged) or an extent start
(contiguous). Two backends compute the same thing: the Triton kernels of `kernels/` (on GPUs,
and in Triton's interpreter for tests) and their PyTorch references (anywhere). Kernel modules
are imported on first use, so a machine without Triton runs the reference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import torch

BACKENDS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] int64: arena slot of each new token (-1: padding, not stored)
    cu_seqlens: torch.Tensor  # [B + 1] int64 offsets of each sequence's new tokens in [T]
    context_lens: torch.Tensor  # [B] int32: positions attended (new tokens included; 0: padding row)
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32: paged addressing
    block_size: int = 0
    starts: torch.Tensor | None = None  # [B] int64: contiguous addressing (extent starts)
    max_new: int = 1  # prefill: most new tokens of one sequence (sizes the kernel grid)
    num_splits: int | None = None  # decode: split-KV partitions (fixed inside a CUDA graph)
    # prefill: its first `decode_rows` sequences have one new token each and attend through the
    # decode kernel (with `num_splits`); 0: every row through the extend kernel
    decode_rows: int = 0
    backend: str = "torch"  # "triton" or "torch"
    # a table per KV group (`hybrid`, `jenga`): this metadata for each table, its own slots and
    # block tables; layer i uses `per_table[arena.table_of[i]]`. None: one table for all layers
    # (and the only value a tensor-parallel forward sends: `kvbench.parallel.channel`)
    per_table: tuple[AttentionMetadata, ...] | None = None

    def addressing(self) -> dict:
        return {"block_tables": self.block_tables, "block_size": self.block_size, "starts": self.starts}


def resolve_backend(name: str, device: torch.device) -> str:
    """`auto`: the Triton kernels on CUDA (or under TRITON_INTERPRET=1), else the reference."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name != "auto":
        return name
    usable = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return "triton" if usable and triton_available() else "torch"


@cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def _ops(backend: str):
    """(store_kv, extend, decode) of a backend, imported on first use."""
    if backend == "triton":
        from kernels.decode_attention import decode_attention
        from kernels.extend_attention import extend_attention
        from kernels.kv_store import store_kv

        return store_kv, extend_attention, decode_attention
    from kernels.reference import decode_attention_ref, extend_attention_ref, store_kv_ref

    def extend(q, k_cache, v_cache, cu_seqlens, context_lens, *, max_new, **kwargs):
        return extend_attention_ref(q, k_cache, v_cache, cu_seqlens, context_lens, **kwargs)

    def decode(q, k_cache, v_cache, context_lens, *, num_splits, **kwargs):
        return decode_attention_ref(q, k_cache, v_cache, context_lens, **kwargs)

    return store_kv_ref, extend, decode


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float, *, window: int = 0, softcap: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """q `[T, H, D]`, new k/v `[T, Hkv, D]` -> output `[T, H, D]`; stores the new K/V first.

    A sliding `window` (the last `window` positions) and a score `softcap` (Gemma 2's) run the
    Triton kernels on the triton backend (constants per layer: a compiled variant each, so CUDA
    graphs replay them) and the PyTorch window attention (`window_attention.py`) on the torch
    backend, whose references do neither.
    """
    store_kv, extend, decode = _ops(meta.backend)
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    if (softcap or window) and meta.backend != "triton":
        from kvbench.modeling.window_attention import decode_window_attention, extend_window_attention

        if meta.is_prefill:
            return extend_window_attention(
                q, k_cache, v_cache, meta.cu_seqlens, meta.context_lens, scale=scale, window=window,
                softcap=softcap, **meta.addressing(),
            )  # fmt: skip
        return decode_window_attention(
            q, k_cache, v_cache, meta.context_lens, scale=scale, window=window, softcap=softcap,
            **meta.addressing(),
        )  # fmt: skip
    # the kernels' bound and cap; the references take neither (nor are they given them: see above)
    windowed = ({"window": window} if window else {}) | ({"softcap": softcap} if softcap else {})
    if meta.is_prefill and meta.decode_rows:
        return _split_prefill(q, k_cache, v_cache, meta, scale, windowed)
    if meta.is_prefill:
        return extend(
            q, k_cache, v_cache, meta.cu_seqlens, meta.context_lens, scale=scale, max_new=meta.max_new,
            **windowed, **meta.addressing(),
        )  # fmt: skip
    return decode(
        q, k_cache, v_cache, meta.context_lens, scale=scale, num_splits=meta.num_splits, **windowed,
        **meta.addressing(),
    )  # fmt: skip


def _split_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
    windowed: dict,
) -> torch.Tensor:  # fmt: skip
    """A prefill whose first `meta.decode_rows` sequences (one token each, the first rows of q
    `[T, H, D]`) attend through the decode kernel and the rest through the extend kernel."""
    _, extend, decode = _ops(meta.backend)
    rows = meta.decode_rows
    addressing = meta.addressing()  # block tables `[B, W]` or extent starts `[B]`, split by rows below
    head = {k: v[:rows] if isinstance(v, torch.Tensor) else v for k, v in addressing.items()}
    tail = {k: v[rows:] if isinstance(v, torch.Tensor) else v for k, v in addressing.items()}
    out = torch.empty_like(q)  # [T, H, D]
    kernels = meta.backend == "triton"  # the kernels write into `out`'s rows; the references return theirs
    done = decode(
        q[:rows], k_cache, v_cache, meta.context_lens[:rows], scale=scale, num_splits=meta.num_splits,
        **windowed, **head, **({"out": out[:rows]} if kernels else {}),
    )  # fmt: skip  # [rows, H, D]
    if not kernels:
        out[:rows] = done
    if len(meta.context_lens) > rows:  # prompt chunks follow: their tokens from q's row `rows` on
        done = extend(
            q[rows:], k_cache, v_cache, meta.cu_seqlens[rows:] - rows, meta.context_lens[rows:], scale=scale,
            max_new=meta.max_new, **windowed, **tail, **({"out": out[rows:]} if kernels else {}),
        )  # fmt: skip  # [T - rows, H, D]
        if not kernels:
            out[rows:] = done
    return out
