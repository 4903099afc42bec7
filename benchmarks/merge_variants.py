"""Decode attention's two split-KV merges, timed side by side on one GPU.

`kernels.decode_attention` merges split-KV partials with a second kernel (`merge="kernel"`) or
in the last split program of each (sequence, KV head) to finish (`merge="fused"`, one launch).
The fused merge saves a fixed cost per call, a launch and its tail, which weighs most where a
step is short: in the 64K-256K band of batch x context the kernel reached 0.78-0.79 of the read
bandwidth (results/reference/kernels-bench). This times both on the reference kernel cells (bf16,
32 query heads, 8 KV heads, head dim 128, block 16, random page order, every sequence at the full
context), at the split count the heuristic picks (`auto`) and at every other one asked for:

    PYTHONPATH=. python benchmarks/merge_variants.py --json merge_variants.json

How it measures, as `kvbench kernels` does: the read bandwidth first (`kernels.bandwidth`), then
per cell several input copies holding 4 L2s together, cycled so no call finds its KV in L2;
CUDA-event medians (`time_cuda`). All variants of a cell run interleaved in one timed sequence
(a block of calls each, over every copy, in turn), so clock or thermal drift hits them alike.
GB/s counts the useful bytes (K and V of every context position, q and the output). Every
variant's output is checked against the PyTorch reference on the first sequences, and the
fused merge's tickets must be all zero after the timing.

Only torch and Triton are needed (imported when timing starts): `--help` works anywhere, and
without CUDA the script stops with one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

CELLS = "8x1024,8x8192,16x4096,32x2048,64x1024,64x4096,256x1024,256x2048,32x16384"
L2_MULTIPLE, MAX_COPIES = 4, 16  # copies hold 4 L2s together, at least 2 and at most 16 of them
CHECKED_ROWS = 2  # sequences compared with the reference (its fp32 gather is large at long contexts)


@dataclass(frozen=True)
class Variant:
    merge: str  # "kernel" | "fused" | "none" (one split: the kernel writes the output, nothing to merge)
    splits: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=CELLS, help="comma list of BATCHxCONTEXT (default: %(default)s)")
    parser.add_argument(
        "--splits", default="auto,1,2,4,8,16", help="split counts; auto = the heuristic's (%(default)s)"
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--gqa", type=int, default=4, help="query heads per KV head")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per variant (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the rows and the bandwidth here")
    args = parser.parse_args(argv)
    try:
        args.cells = parse_cells(args.cells)
        args.splits = [s if s == "auto" else int(s) for s in args.splits.split(",")]
    except ValueError as error:
        parser.error(str(error))
    if any(s != "auto" and s < 1 for s in args.splits) or args.repeats < 2:
        parser.error("split counts must be >= 1 and --repeats >= 2")
    return args


def parse_cells(text: str) -> list[tuple[int, int]]:
    """'8x8192,64x1024' -> [(8, 8192), (64, 1024)]."""
    cells = []
    for item in text.split(","):
        batch, _, context = item.strip().partition("x")
        if not (batch.isdigit() and context.isdigit() and int(batch) > 0 and int(context) > 0):
            raise ValueError(f"a cell is BATCHxCONTEXT, got {item!r}")
        cells.append((int(batch), int(context)))
    return cells


def variants_of(splits: list, heuristic: int) -> list[Variant]:
    """Both merges at each distinct split count; one split has nothing to merge."""
    counts = sorted({heuristic if s == "auto" else s for s in splits})
    return [
        variant
        for n in counts
        for variant in ([Variant("none", 1)] if n == 1 else [Variant("kernel", n), Variant("fused", n)])
    ]


def make_inputs(batch: int, context: int, args, copies: int, device):
    """Lengths, a block table in random page order, and `copies` independent (q, k, v, out)."""
    import torch

    dtype = getattr(torch, args.dtype)
    seed = args.seed * 1_000_003 + batch * 7919 + context
    blocks = -(-context // args.block_size)
    slots = batch * blocks * args.block_size
    order = torch.randperm(batch * blocks, generator=torch.Generator().manual_seed(seed))  # physical blocks
    table = order.reshape(batch, blocks).to(torch.int32).to(device)  # [B, blocks]
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)  # [B]
    heads = args.kv_heads * args.gqa
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn where they live: GiBs of them

    def randn(*shape: int):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    sets = [
        (
            randn(batch, heads, args.head_dim),  # q [B, H, D]
            randn(slots, args.kv_heads, args.head_dim),  # k [S, Hkv, D]
            randn(slots, args.kv_heads, args.head_dim),  # v [S, Hkv, D]
            torch.empty(batch, heads, args.head_dim, dtype=dtype, device=device),  # out [B, H, D]
        )
        for _ in range(copies)
    ]
    return lens, table, sets


def copies_for(batch: int, context: int, args, device) -> int:
    import torch

    arena = 2 * batch * context * args.kv_heads * args.head_dim * getattr(torch, args.dtype).itemsize
    if device.type != "cuda":
        return 2
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 10**6
    return max(2, min(MAX_COPIES, math.ceil(L2_MULTIPLE * l2 / arena)))


def measure_cell(batch: int, context: int, args, device, read_bw: float, timer) -> list[dict]:
    """Every variant of one cell: checked against the reference, then timed interleaved."""
    import torch

    from kernels.decode_attention import decode_attention
    from kernels.reference import decode_attention_ref
    from kernels.splits import DecodeWorkspace, choose_num_splits

    heads = args.kv_heads * args.gqa
    heuristic = choose_num_splits(batch, args.kv_heads, context, device)
    variants = variants_of(args.splits, heuristic)
    copies = copies_for(batch, context, args, device)
    lens, table, sets = make_inputs(batch, context, args, copies, device)
    workspace = DecodeWorkspace.allocate(
        batch, heads, args.kv_heads, args.head_dim, max(v.splits for v in variants), device
    )
    scale = args.head_dim**-0.5

    def call(variant: Variant, q, k, v, out):
        return lambda: decode_attention(
            q, k, v, lens, scale=scale, block_tables=table, block_size=args.block_size,
            num_splits=variant.splits, out=out, merge="fused" if variant.merge == "fused" else "kernel",
            workspace=workspace,
        )  # fmt: skip

    rows = slice(0, min(batch, CHECKED_ROWS))
    q0, k0, v0, out0 = sets[0]
    expected = decode_attention_ref(
        q0[rows], k0, v0, lens[rows], scale=scale, block_tables=table[rows], block_size=args.block_size
    ).float()
    errors, outputs = {}, {}
    for variant in variants:
        out0.fill_(float("nan"))
        call(variant, *sets[0])()
        errors[variant] = float((out0[rows].float() - expected).abs().max())
        outputs[variant] = out0.float()  # [B, H, D]
    # every sequence, not only the checked ones: the fused merge against the merge kernel
    diffs = {
        v: float((outputs[v] - outputs[Variant("kernel", v.splits)]).abs().max())
        for v in variants
        if v.merge == "fused"
    }
    del outputs
    # the timed sequence: variant after variant, each for one pass over the copies, round and round
    fns = [call(variant, *s) for variant in variants for s in sets]
    per_variant = args.repeats + (-args.repeats % copies)  # whole passes over the copies
    seconds = timer(fns, warmup=max(args.warmup, 1), repeats=per_variant * len(variants))
    samples: dict[Variant, list[float]] = {v: [] for v in variants}
    for i, s in enumerate(seconds):
        samples[variants[(i % len(fns)) // copies]].append(s)
    tickets_clean = bool((workspace.tickets == 0).all())

    elt = getattr(torch, args.dtype).itemsize
    kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * elt  # K and V of every position
    useful = kv_bytes + 2 * batch * heads * args.head_dim * elt  # + q and the output
    kernel_us = {v.splits: statistics.median(samples[v]) * 1e6 for v in variants if v.merge == "kernel"}
    out = []
    for variant in variants:
        us = statistics.median(samples[variant]) * 1e6
        deciles = statistics.quantiles([s * 1e6 for s in samples[variant]], n=10)
        gbps = useful / (us * 1e-6) / 1e9
        out.append(
            dict(
                cell=f"B{batch} L{context}", batch=batch, context=context, block_size=args.block_size,
                dtype=args.dtype, splits=variant.splits, heuristic=variant.splits == heuristic,
                merge=variant.merge, us=us, us_p10=deciles[0], us_p90=deciles[-1], useful_bytes=useful,
                gbps=gbps, bw_fraction=gbps * 1e9 / read_bw,
                vs_kernel=us / kernel_us[variant.splits] if variant.splits in kernel_us else None,
                max_abs_err=errors[variant], fused_vs_kernel_max_diff=diffs.get(variant),
                tickets_clean=tickets_clean, copies=copies,
                samples=len(samples[variant]),
            )
        )  # fmt: skip
    return out


def format_table(rows: list[dict]) -> str:
    head = f"{'cell':<14} {'splits':>6} {'merge':<7} {'us':>8} {'p10':>8} {'p90':>8} {'GB/s':>6}"
    head += f" {'of read':>7} {'vs kernel':>9} {'max err':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        mark = "*" if r["heuristic"] else " "
        vs = "" if r["vs_kernel"] is None else f"{r['vs_kernel']:.3f}"
        lines.append(
            f"{r['cell']:<14} {r['splits']:>5}{mark} {r['merge']:<7} {r['us']:>8.1f} {r['us_p10']:>8.1f} "
            f"{r['us_p90']:>8.1f} {r['gbps']:>6.0f} {r['bw_fraction']:>7.3f} {vs:>9} {r['max_abs_err']:>8.1e}"
        )
    return "\n".join(lines)


def summarize(rows: list[dict]) -> list[dict]:
    """Per cell: each merge at the heuristic's split count, and the fastest variant overall."""
    out = []
    for cell in dict.fromkeys(r["cell"] for r in rows):
        mine = [r for r in rows if r["cell"] == cell]
        at_heuristic = {r["merge"]: r for r in mine if r["heuristic"]}
        best = min(mine, key=lambda r: r["us"])
        fused = at_heuristic.get("fused")
        out.append(
            dict(
                cell=cell,
                heuristic_splits=next(r["splits"] for r in mine if r["heuristic"]),
                **{f"{m}_bw_fraction": round(r["bw_fraction"], 4) for m, r in at_heuristic.items()},
                fused_vs_kernel=None if fused is None else round(fused["vs_kernel"], 4),
                best_merge=best["merge"], best_splits=best["splits"],
                best_bw_fraction=round(best["bw_fraction"], 4),
            )
        )  # fmt: skip
    return out


def row_ok(row: dict, atol: float) -> bool:
    """Within `atol` of the reference (and of the merge kernel's output), tickets back at zero."""
    errors = (row["max_abs_err"], row["fused_vs_kernel_max_diff"])
    return row["tickets_clean"] and all(e <= atol for e in errors if e is not None)  # NaN fails


def write_json(path: Path, data: dict) -> None:
    """Through a temporary sibling and a rename: an interrupted run leaves the previous cells' file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("merge_variants: torch is not importable; nothing timed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("merge_variants: needs a CUDA device (timing uses CUDA events); nothing timed", file=sys.stderr)
        return 1
    import triton

    from kernels.bandwidth import read_bandwidth_report, time_cuda
    from kernels.bench_types import ATOL

    device = torch.device("cuda", torch.cuda.current_device())
    bandwidth = read_bandwidth_report(device)  # what measure_read_bandwidth returns, with its workings
    read_bw = bandwidth["read_bandwidth_bytes_per_s"]
    print(f"read bandwidth {read_bw / 1e12:.3f} TB/s ({bandwidth['method']}, {bandwidth['device']})")
    meta = dict(
        device=torch.cuda.get_device_name(device), torch=torch.__version__, triton=triton.__version__,
        shape=dict(q_heads=args.kv_heads * args.gqa, kv_heads=args.kv_heads, head_dim=args.head_dim,
                   block_size=args.block_size, dtype=args.dtype),
        argv=sys.argv[1:] if argv is None else argv, bandwidth=bandwidth,
    )  # fmt: skip
    rows: list[dict] = []
    for batch, context in args.cells:
        cell_rows = measure_cell(batch, context, args, device, read_bw, time_cuda)
        rows += cell_rows
        print(format_table(cell_rows).split("\n", 2)[-1], flush=True)
        if args.json:
            write_json(args.json, dict(meta, rows=rows, summary=summarize(rows)))
        torch.cuda.empty_cache()
    print("\n" + format_table(rows) + "\n(* the heuristic's split count)")
    for s in summarize(rows):
        print(json.dumps(s))
    bad = [r for r in rows if not row_ok(r, ATOL[r["dtype"]])]
    if bad:
        print(f"merge_variants: {len(bad)} rows wrong or with tickets left nonzero", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
