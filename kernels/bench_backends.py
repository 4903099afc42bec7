"""The kernel benchmark's backends: each builds one callable per input copy of a cell.

kvbench's kernel (paged, contiguous, and contiguous over CUDA virtual memory as vAttention lays
it out; on an MLA cell, the paged and contiguous MLA decode kernel), PyTorch SDPA on a padded
contiguous cache, compiled FlexAttention over the paged arena, and FlashInfer's paged decode
when it is importable.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from functools import partial

import torch

from kernels.bench_types import DTYPES, Built, Cell, Context, Copy, Layout, scale_of

# ---- the backends: each builds one callable per input copy ------------------------------------


def _build_kvbench(addressing: str):
    def build(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
        from kernels.decode_attention import decode_attention
        from kernels.splits import choose_num_splits

        if addressing == "paged":
            where = dict(block_tables=layout.block_tables, block_size=cell.block_size)
        else:
            where = dict(starts=layout.starts)
        if cell.latent:
            return _build_mla(cell, layout, inputs, context, addressing, where)
        # the kernel's own choice, made here: left to it, it reads the lengths on the host (a sync)
        read = min(layout.max_len, cell.window) if cell.window else layout.max_len  # positions a row reads
        splits = choose_num_splits(cell.batch, cell.kv_heads, read, context.device)
        run = partial(
            decode_attention, context_lens=layout.lens, scale=scale_of(cell), num_splits=splits,
            window=cell.window, softcap=cell.softcap, **where,
        )  # fmt: skip
        calls = tuple(partial(run, c.q, c.k, c.v, out=c.out) for c in inputs)
        note = f"{splits} KV splits" + ("; random page order" if addressing == "paged" else "")
        return Built(calls, addressing, note=note)

    return build


def _build_mla(cell: Cell, layout: Layout, inputs: list[Copy], context: Context, addressing, where) -> Built:
    """The MLA decode kernel over the one cache of each copy (`Copy.k`; `v` is the same tensor)."""
    from kernels.mla_decode import mla_decode_attention
    from kernels.splits import choose_mla_splits

    splits = choose_mla_splits(cell.batch, cell.q_heads, layout.max_len, context.device)
    run = partial(
        mla_decode_attention, context_lens=layout.lens, scale=scale_of(cell), latent=cell.latent,
        num_splits=splits, **where,
    )  # fmt: skip
    calls = tuple(partial(run, c.q, c.k, out=c.out) for c in inputs)
    note = f"MLA absorbed, {splits} KV splits" + ("; random page order" if addressing == "paged" else "")
    return Built(calls, addressing, note=note)


def _build_virtual(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
    """kvbench's contiguous kernel over K and V in CUDA virtual memory, laid out as vAttention
    lays out a layer: sequence b at the start of its own range (as long as the longest sequence,
    in whole pages), only the pages under its tokens mapped. The bytes are each copy's own, so
    the output must equal the contiguous backend's."""
    if context.device.type != "cuda":
        raise RuntimeError("kvbench-virtual needs CUDA (the driver's virtual-memory calls)")
    from kernels.decode_attention import decode_attention
    from kernels.splits import choose_num_splits
    from kvbench.vmm.driver import Driver, VirtualBuffer, range_tokens

    driver = Driver(context.device.index or 0)
    row = cell.kv_heads * cell.head_dim * DTYPES[cell.dtype].itemsize  # bytes of one token's K (or V)
    stride = range_tokens(layout.max_len, row, driver.granularity())
    lens, starts = layout.lens.tolist(), layout.starts.tolist()
    virtual_starts = torch.arange(cell.batch, dtype=torch.int32, device=context.device) * stride  # [B]
    splits = choose_num_splits(cell.batch, cell.kv_heads, layout.max_len, context.device)
    calls, buffers = [], []
    for c in inputs:
        pair = []
        for source in (c.k, c.v):
            buffer = VirtualBuffer(driver, cell.batch * stride * row)
            buffers.append(buffer)
            for b, length in enumerate(lens):
                buffer.map(b * stride * row, length * row)
            arena = buffer.tensor((cell.batch * stride, cell.kv_heads, cell.head_dim), DTYPES[cell.dtype])
            for b, (length, start) in enumerate(zip(lens, starts, strict=True)):
                arena[b * stride : b * stride + length] = source[start : start + length]  # [len, Hkv, D]
            pair.append(arena)
        calls.append(
            partial(
                decode_attention, c.q, *pair, out=c.out, context_lens=layout.lens, starts=virtual_starts,
                scale=scale_of(cell), num_splits=splits,
            )
        )  # fmt: skip
    mapped = sum(b.mapped_bytes for b in buffers) // len(inputs)
    used = 2 * sum(lens) * row
    holder = _Pages(buffers)
    weakref.finalize(holder, _close_all, buffers)  # pages go back when the calls are dropped
    for call in calls:
        call.pages = holder
    note = f"{splits} KV splits; {mapped >> 20} MiB of 2 MiB pages mapped for {used >> 20} MiB of K/V"
    return Built(tuple(calls), "contiguous", note=note)


class _Pages:
    """Owns a backend's virtual buffers for as long as its calls live."""

    def __init__(self, buffers: list) -> None:
        self.buffers = buffers


def _close_all(buffers: list) -> None:
    torch.cuda.synchronize()  # no kernel may still read a page being unmapped
    for buffer in buffers:
        buffer.close()


def _build_sdpa(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
    """SDPA over a padded [B, H, L, D] cache: a view of the contiguous arena unless ragged."""
    length, mask = layout.max_len, None
    if cell.ragged:
        positions = torch.arange(length, device=context.device)  # [L]
        mask = (positions < layout.lens[:, None]).view(cell.batch, 1, 1, length)  # [B, 1, 1, L]: attend
    expand = cell.gqa > 1 and not context.sdpa_gqa
    calls = []
    for c in inputs:
        k, v = _padded(c.k, layout, cell), _padded(c.v, layout, cell)  # [B, Hkv, L, D]
        if expand:
            k, v = k.repeat_interleave(cell.gqa, 1), v.repeat_interleave(cell.gqa, 1)  # [B, Hq, L, D]
        gqa = cell.gqa > 1 and not expand
        calls.append(partial(_sdpa, c.q.unsqueeze(2), k, v, mask, scale_of(cell), gqa))  # q [B, Hq, 1, D]
    elt = DTYPES[cell.dtype].itemsize
    kv_bytes = 2 * cell.batch * length * (cell.q_heads if expand else cell.kv_heads) * cell.head_dim * elt
    notes = ["padded to the longest, masked" if cell.ragged else "view of the contiguous arena"]
    notes.append(f"KV heads expanded x{cell.gqa} (no enable_gqa)" if expand else "enable_gqa")
    if context.device.type == "cuda":
        backend = _sdpa_backend(calls[0])
        calls = [partial(_with_sdpa_backend, backend, call) for call in calls]
        notes.append(f"SDPA backend {backend.name.lower()}")
    qo_bytes = 2 * cell.batch * cell.q_heads * cell.head_dim * elt
    return Built(tuple(calls), "contiguous", moved_bytes=kv_bytes + qo_bytes, note="; ".join(notes))


def _padded(t: torch.Tensor, layout: Layout, cell: Cell) -> torch.Tensor:
    """The arena [S, Hkv, D] as [B, Hkv, L, D]: a view when every length is L, else a gather."""
    if not cell.ragged:
        return t[: cell.batch * layout.max_len].view(cell.batch, layout.max_len, *t.shape[1:]).transpose(1, 2)
    slots = layout.starts[:, None].long() + torch.arange(layout.max_len, device=t.device)  # [B, L]
    return t[slots.clamp(max=t.shape[0] - 1)].transpose(1, 2)  # [B, Hkv, L, D]; past a length: masked


def _sdpa(q, k, v, mask, scale: float, gqa: bool) -> torch.Tensor:
    extra = {"enable_gqa": True} if gqa else {}
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **extra)
    return out.squeeze(2)  # [B, Hq, D]


def _sdpa_backend(call: Callable[[], torch.Tensor]):
    """The first SDPA backend that runs this call, in the order flash, efficient, cuDNN, math."""
    from torch.nn.attention import SDPBackend

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    for backend in (getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _with_sdpa_backend(backend, call)
            return backend
        except RuntimeError:
            continue
    raise RuntimeError("no SDPA backend runs this shape")


def _with_sdpa_backend(backend, call: Callable[[], torch.Tensor]) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return call()


def _build_flex(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
    """Compiled FlexAttention reading the paged arena through a block mask made of the table."""
    if context.flex is None:
        raise RuntimeError("flex-paged needs CUDA and torch.nn.attention.flex_attention (torch 2.5+)")
    if cell.block_size < 16:  # found on an H200 with torch 2.11: Triton rejects the kernel's tl.dot
        raise RuntimeError("flex-paged needs blocks of 16+ tokens (its decode kernel's tl.dot needs K >= 16)")
    torch._dynamo.reset()  # a fresh compile per cell: shapes change anyway, and no recompile limit
    block_mask = flex_block_mask(layout, cell.batch)
    run = partial(_flex, context.flex, block_mask=block_mask, scale=scale_of(cell), gqa=cell.gqa > 1)
    calls = tuple(partial(run, c.q.unsqueeze(2), _arena_bhsd(c.k), _arena_bhsd(c.v)) for c in inputs)
    return Built(calls, "paged", note="torch.compile(flex_attention), block mask from the block table")


def _arena_bhsd(t: torch.Tensor) -> torch.Tensor:
    return t.permute(1, 0, 2).unsqueeze(0)  # [S, Hkv, D] -> [1, Hkv, S, D], a view; batch broadcast


def _flex(flex, q, k, v, *, block_mask, scale: float, gqa: bool) -> torch.Tensor:
    return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa).squeeze(2)  # [B, Hq, D]


def flex_block_mask(layout: Layout, batch: int):
    """A FlexAttention BlockMask whose KV blocks are the table's physical blocks, in logical order.

    It is what torch's experimental `PagedAttention.convert_logical_block_mask` makes, built
    straight from our table without that class's [B, n_pages] tables: a sequence's whole
    blocks are "full" blocks (no mask evaluated on them), its partly filled last block is a
    masked one, and the mask maps a physical slot back to (sequence, position) through two
    [n_blocks] maps, so it is also right where FlexAttention applies it everywhere (eager).
    """
    from torch.nn.attention.flex_attention import BlockMask

    bs, table, lens = layout.block_size, layout.block_tables, layout.lens
    width = table.shape[1]
    blocks = (lens + bs - 1) // bs  # [B]
    held = torch.arange(width, device=lens.device)[None, :] < blocks[:, None]  # [B, max_blocks]
    physical = table[held].long()  # [sum blocks]
    owner = torch.full((layout.num_slots // bs,), -1, dtype=torch.int32, device=lens.device)  # [n_blocks]
    logical = torch.zeros_like(owner)  # [n_blocks]: the block's index in its sequence
    owner[physical] = held.nonzero()[:, 0].int()
    logical[physical] = held.nonzero()[:, 1].int()
    full = (lens // bs).int()  # [B] blocks attended in full
    partly = (lens % bs != 0).int()  # [B] 1 when the last block is partly filled
    # the partly filled block, first in a list as wide as the full one: the decode kernel
    # finds a sequence's row in both lists with the partial list's strides
    last = torch.zeros_like(table)  # [B, max_blocks]
    last[:, 0] = table.gather(1, full.clamp(max=width - 1).long()[:, None])[:, 0]

    def mask_mod(b, h, q_idx, kv_idx):
        block = kv_idx // bs
        return (owner[block] == b) & (logical[block] * bs + kv_idx % bs < lens[b])

    return BlockMask.from_kv_blocks(
        partly.view(batch, 1, 1), last.view(batch, 1, 1, width),
        full.view(batch, 1, 1), table.view(batch, 1, 1, width).contiguous(),
        BLOCK_SIZE=(128, bs), mask_mod=mask_mod, seq_lengths=(1, layout.num_slots), compute_q_blocks=False,
    )  # fmt: skip


def _build_flashinfer(tensor_cores: bool):
    def build(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
        if context.flashinfer is None:
            raise RuntimeError("flashinfer is not importable")
        bs, dtype = cell.block_size, DTYPES[cell.dtype]
        blocks = (layout.lens + bs - 1) // bs  # [B]
        indptr = torch.nn.functional.pad(blocks.cumsum(0), (1, 0)).int()  # [B + 1]
        held = torch.arange(layout.block_tables.shape[1], device=context.device)[None, :] < blocks[:, None]
        indices = layout.block_tables[held].int()  # [sum blocks], each sequence's in logical order
        last_page_len = (layout.lens - (blocks - 1) * bs).int()  # [B], in [1, bs]
        workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=context.device)
        wrapper = context.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=tensor_cores
        )
        wrapper.plan(
            indptr, indices, last_page_len, cell.q_heads, cell.kv_heads, cell.head_dim, bs,
            pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype, sm_scale=scale_of(cell),
        )  # fmt: skip
        pages = (layout.num_slots // bs, bs, cell.kv_heads, cell.head_dim)
        calls = tuple(partial(wrapper.run, c.q, (c.k.view(pages), c.v.view(pages))) for c in inputs)
        return Built(calls, "paged", note="NHD pages, random page order")

    return build


BUILDERS = {
    "kvbench-paged": _build_kvbench("paged"),
    "kvbench-contiguous": _build_kvbench("contiguous"),
    "kvbench-virtual": _build_virtual,
    "torch-sdpa": _build_sdpa,
    "flex-paged": _build_flex,
    "flashinfer-cuda-cores": _build_flashinfer(tensor_cores=False),
    "flashinfer-tensor-cores": _build_flashinfer(tensor_cores=True),
}
