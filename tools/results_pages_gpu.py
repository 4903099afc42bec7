"""docs/results/{kernels,real-decoding,virtual-memory,sharing}.md: the GPU measurements of
results/reference/, read from the files each benchmark wrote (kernels.csv, the JSON figures,
the sharing CSVs, the vmm occupancy table).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import results_pages_common as common
from results_pages_common import csv, fixed, json_file, num, page, rel, table

# ---- kernels ------------------------------------------------------------------------------

KERNELS = Path("results/reference/kernels-bench")
MERGE = Path("results/reference/kernel-merge-variants")
TUNING = Path("results/reference/kernel-tuning")
FLASHINFER = Path("results/reference/kernels-flashinfer")


def kernel_cells_table(path: Path, backends: Sequence[str]) -> str:
    """Fraction of the measured read bandwidth per cell and backend, and paged / contiguous time."""
    frame = csv(path)
    rows = []
    for (batch, context), group in frame.groupby(["batch", "context"], sort=True):
        by = group.set_index("backend")
        fractions = [fixed(by.bw_fraction.get(b), 2) if b in by.index else "-" for b in backends]
        ratio = by.us["kvbench-paged"] / by.us["kvbench-contiguous"]
        rows.append([f"({batch}, {context:,})", f"{batch * context // 1024:,}K", *fractions, fixed(ratio, 2)])
    return table(["(B, L)", "B x L", *backends, "paged / contiguous time"], rows)


def block_size_kernel_table(path: Path) -> str:
    frame = csv(path)
    paged = frame[frame.backend == "kvbench-paged"]
    blocks = sorted(paged.block_size.unique())
    rows = []
    for (batch, context), group in paged.groupby(["batch", "context"], sort=True):
        by = group.set_index("block_size").vs_contiguous
        rows.append([batch, f"{context:,}", *(fixed(by.get(b), 3) for b in blocks)])
    return table(["batch", "context", *(f"block size {b}" for b in blocks)], rows)


def merge_table() -> str:
    data = json_file(MERGE / "merge_variants.json")
    rows = [
        [
            s["cell"],
            s["heuristic_splits"],
            fixed(s.get("kernel_bw_fraction", s.get("none_bw_fraction")), 3),
            fixed(s.get("fused_bw_fraction"), 3),
            fixed(s["fused_vs_kernel"], 3),
        ]
        for s in data["summary"]
    ]
    note = "One split needs no merge: its row is the kernel alone.\n\n"
    return note + table(
        ["cell", "splits", "merge kernel: fraction of read bw", "fused merge", "fused / kernel time"], rows
    )


def flashinfer_tables() -> str:
    """The folder's table.md (its make.py reads the runs), a section a GPU and shape set."""
    lines = (common.ROOT / FLASHINFER / "table.md").read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("## "))
    return "\n".join("#" + line if line.startswith("## ") else line for line in lines[first:])


def kernels_page() -> str:
    bandwidth = json_file(KERNELS / "issue-cells/bandwidth.json")["read_bandwidth_bytes_per_s"]
    sections = [
        "## Decode attention against the read bandwidth\n\n"
        f"bf16, 32 query heads, 8 KV heads, head dim 128, block size 16, random page order; fraction of "
        f"the read bandwidth measured in the same run ({bandwidth / 1e12:.2f} TB/s, Triton streaming "
        f"read); `paged / contiguous time`: kvbench's paged kernel over its contiguous mode "
        f"({rel(KERNELS / 'issue-cells/kernels.csv')}).\n\n"
        + kernel_cells_table(
            KERNELS / "issue-cells/kernels.csv",
            ("kvbench-paged", "kvbench-contiguous", "torch-sdpa", "flex-paged"),
        ),
        "## Figure 18a: block size in the kernel\n\n"
        f"Time of kvbench's paged kernel over its contiguous mode at each block size "
        f"({rel(KERNELS / 'fig18a/kernels.csv')}).\n\n"
        + block_size_kernel_table(KERNELS / "fig18a/kernels.csv"),
        "## Merging split-KV partial results: a kernel of its own or the last split\n\n"
        "The fused merge (the last split program merges, taking an atomic ticket) against the separate "
        "merge kernel, at the split counts of the rule then in use "
        f"({rel(MERGE / 'merge_variants.json')}).\n\n" + merge_table(),
        "## Beside FlashInfer, in one run\n\n"
        "kvbench's kernels beside FlashInfer 0.7.2.post1's two decode paths and SDPA in one process "
        f"(median us; a tie: the 10th-90th percentile ranges overlap; {rel(FLASHINFER / 'table.md')}).\n\n"
        + flashinfer_tables(),
        "## The split rule's tuning\n\n"
        f"Text logs of `benchmarks/tune_decode.py` ({rel(TUNING)}); the rule they chose is "
        "`kernels/splits.py`.",
    ]
    intro = (
        "kvbench's decode-attention kernels on the GPU (`kvbench kernels`, `benchmarks/`). One run per table."
    )
    return page("Kernels", intro, [KERNELS, FLASHINFER, MERGE, TUNING], sections)


# ---- real decoding ------------------------------------------------------------------------

REAL = Path("results/reference/real-decode-kernels")
ANCHORS = Path("results/reference/anchors-h200")
COLLECTORS = Path("results/reference/collectors-cost")


def real_decode_table() -> str:
    rows = []
    for name in ("real_decode.json", "real_decode_split_rule.json", "real_decode_nographs.json"):
        for engine, f in json_file(REAL / name)["figures"].items():
            rows.append(
                [
                    f"`{name}`",
                    engine,
                    "yes" if f["cuda_graphs"] else "no",
                    fixed(f["output_tokens_per_s"], 0),
                    fixed(f["mean_decode_step_ms"], 2),
                    f"{f['steps']:,} ({f['engine_calls']})",
                    f["peak_running"],
                ]
            )
    return table(
        [
            "file",
            "engine",
            "CUDA graphs",
            "output tokens/s",
            "mean decode step ms",
            "steps (engine calls)",
            "peak batch",
        ],
        rows,
    )


def roofline_tables() -> str:
    data = json_file(REAL / "decode_step.json")
    steps: dict[int, dict[str, float]] = {}
    for r in data["roofline"]:
        steps.setdefault(r["batch"], {"floor": r["floor_ms"]})[r["addressing"]] = r["step_ms"]
        if r["addressing"] == "paged":
            steps[r["batch"]]["efficiency"] = r["efficiency"]
    roof = table(
        ["batch", "paged step ms", "contiguous step ms", "floor ms", "paged efficiency %"],
        [
            [
                b,
                fixed(s["paged"], 2),
                fixed(s["contiguous"], 2),
                fixed(s["floor"], 2),
                fixed(100 * s["efficiency"], 1),
            ]
            for b, s in sorted(steps.items())
        ],
    )
    shares: dict[str, dict[bool, float]] = {}
    for r in data["host_share"]:
        shares.setdefault(r["engine"], {})[r["segments"]] = r["host_share"]
    host = table(
        ["engine", "host share %, in segments", "one step per engine call"],
        [[e, fixed(100 * s[True], 1), fixed(100 * s[False], 1)] for e, s in shares.items()],
    )
    return (
        f"{data['model']} fp16, random weights, every sequence at context 512, one decode step replayed "
        "as a CUDA graph; floor = (weights + KV read + KV written) / measured read bandwidth.\n\n"
        + roof
        + "\n\nHost share of a decode step at batch 64: 1 - GPU time / loop step time.\n\n"
        + host
    )


def anchors_table() -> str:
    data = json_file(ANCHORS / "anchors.json")
    rows = []
    for engine, r in data["rows"].items():
        reserved = r["torch_peak_reserved_bytes"]
        rows.append(
            [
                engine,
                fixed(r["output_tokens_per_s"], 0),
                fixed(r["ratio_to_paged"], 4),
                fixed(r["mean_ttft_s"], 2),
                fixed(r["mean_tpot_s"], 4),
                fixed(r["makespan_s"], 1),
                "-" if reserved is None else fixed(reserved / 1e9, 1),
            ]
        )
    return (
        f"{data['model']}, {data['num_requests']} requests at once, {data['output_tokens']:,} output tokens, "
        f"transformers {data['transformers']}.\n\n"
        + table(
            [
                "engine",
                "output tokens/s",
                "vs paged",
                "mean TTFT s",
                "mean TPOT s",
                "makespan s",
                "peak torch reserved GB",
            ],
            rows,
        )
    )


def collectors_table() -> str:
    figures = json_file(COLLECTORS / "collectors_after.json")["figures"]
    runs = [(name, f) for name, f in figures.items() if not name.endswith("#warmup")]
    without = [f["output_tokens_per_s"] for _, f in runs if not f["collectors"]]
    with_ = [f["output_tokens_per_s"] for _, f in runs if f["collectors"]]
    cost = 100 * (1 - (sum(with_) / len(with_)) / (sum(without) / len(without)))
    rows = [
        [name, ", ".join(f["collectors"]) or "none", fixed(f["output_tokens_per_s"], 0)] for name, f in runs
    ]
    return (
        table(["run", "collectors", "output tokens/s"], rows)
        + f"\n\nMean without: {fixed(sum(without) / len(without), 0)}; with every collector: "
        f"{fixed(sum(with_) / len(with_), 0)}; cost {cost:.2f} % (the warm-up run is not counted)."
    )


def real_decoding_page() -> str:
    sections = [
        "## The reference workload end to end\n\n"
        "`llama-1b-ref`, bf16, random weights, 256 requests at once (176 in / 269 out on average, "
        "68,760 output tokens), 8 GiB of KV; output tokens over the engine loop's wall time.\n\n"
        + real_decode_table(),
        "## Decode step against its roofline\n\n" + roofline_tables(),
        "## Beside transformers on the same weights and trace\n\n" + anchors_table(),
        "## What the collectors cost\n\nThe reference workload, paged engine, runs alternating without and "
        "with the torch, NVML and roofline collectors.\n\n" + collectors_table(),
    ]
    intro = "Real decoding on the GPU: kvbench's engines with its Triton kernels and CUDA graphs."
    return page("Real decoding", intro, [REAL, ANCHORS, COLLECTORS], sections)


# ---- virtual memory -----------------------------------------------------------------------

PROBE = Path("results/reference/vmm-probe")
VMM_KERNELS = Path("results/reference/vmm-kernels")
VMM_OCCUPANCY = Path("results/reference/vmm-occupancy-sim")
VMM_REAL = Path("results/reference/vmm-real")


def probe_tables() -> str:
    data = json_file(PROBE / "probe.json")
    costs = [
        ("create (physical memory)", data["create_per_page"]),
        ("map + set access, fresh handle", data["map_set_access_per_page"]),
        ("map + set access, handle reused", data["remap_map_set_access"]),
        ("unmap", data["remap_unmap"]),
    ]
    rows = [[what, num(c["n"]), fixed(c["median_us"], 1), fixed(c["p99_us"], 1)] for what, c in costs]
    rows.append(["release", "-", fixed(data["release_us_per_page"], 1), "-"])
    k = table(
        ["pages", "one handle, one call us", "one call per page us"],
        [
            [r["pages"], fixed(r["one_call_us"], 0), fixed(r["k_calls_us"], 0)]
            for r in data["one_handle_vs_k_pages"]
        ],
    )
    busy = data["while_gpu_busy"]
    return (
        f"Page size {data['granularity_bytes'] // 2**20} MiB (the driver's granularity).\n\n"
        + table(["call, per page", "calls", "median us", "p99 us"], rows)
        + "\n\n"
        + k
        + f"\n\nWith {busy['queued_gpu_work_ms']} ms of GPU work queued, map took "
        f"{busy['map_while_busy_us']} us "
        f"and unmap {busy['unmap_while_busy_us']} us; a graph replayed after a remap read the new page: "
        f"{'yes' if data['graph_after_remap']['ok'] else 'no'}."
    )


def vmm_kernel_table(path: Path, label: str) -> list[list[str]]:
    frame = csv(path)
    rows = []
    for (batch, context), group in frame.groupby(["batch", "context"], sort=True):
        us = group.set_index("backend").us
        rows.append(
            [
                f"{label} B{batch} L{context}",
                fixed(us["kvbench-paged"], 1),
                fixed(us["kvbench-contiguous"], 1),
                fixed(us["kvbench-virtual"], 1),
                fixed(us["kvbench-virtual"] / us["kvbench-contiguous"], 2),
                fixed(us["kvbench-paged"] / us["kvbench-virtual"], 2),
            ]
        )
    return rows


def vmm_real_table() -> str:
    data = json_file(VMM_REAL / "vmm_real.json")
    rows = []
    for workload in data["workloads"].values():
        name = f"{workload['model']}, {workload['requests']} requests, {workload['kv_gib']:g} GiB"
        for r in workload["rows"]:
            mapped = "vmm_maps" in r
            rows.append(
                [
                    name,
                    r["variant"],
                    num(r["output_tokens_per_s"]),
                    num(r["steps"]),
                    str(r["peak_running"]),
                    str(r["preemptions"]),
                    f"{num(r['vmm_maps'])} / {num(r['vmm_unmaps'])}" if mapped else "-",
                    fixed(100 * r["map_share"], 1) if mapped else "-",
                ]
            )
    header = ["workload", "variant", "output tok/s", "steps", "peak batch", "preemptions", "maps / unmaps",
              "mapping % of wall"]  # fmt: skip
    return table(header, rows)


def virtual_memory_page() -> str:
    kernels = vmm_kernel_table(VMM_KERNELS / "opt13b/kernels.csv", "OPT-13B") + vmm_kernel_table(
        VMM_KERNELS / "gqa8/kernels.csv", "GQA 8x4"
    )
    occupancy = (common.ROOT / VMM_OCCUPANCY / "table.md").read_text(encoding="utf-8")
    sections = [
        "## Mapping a KV page with the CUDA driver\n\n" + probe_tables(),
        "## Decode attention over virtual memory\n\nThe same kernel over 16-token blocks (paged), one "
        "`cudaMalloc`'d arena (contiguous) and per-sequence virtual ranges with 2 MiB pages mapped "
        "under the tokens (virtual); median microseconds of 50 calls.\n\n"
        + table(
            ["cell", "paged", "contiguous", "virtual", "virtual / contiguous", "paged / virtual"], kernels
        ),
        "## Occupancy of the vmm engine, simulated at the paper's setting\n\nOPT-13B, 15,728 token slots, "
        f"1,000 requests, seeds 0-2 ({rel(VMM_OCCUPANCY / 'table.md')}, as the benchmark wrote it).\n\n"
        + occupancy,
        "## Real decoding over virtual memory\n\nThe `vmm` engine's arena as per-layer virtual tensors "
        "with 2 MiB pages mapped through the driver, beside orca-oracle and paged; one run each "
        f"({rel(VMM_REAL / 'README.md')} says where 2 MiB pages cost it).\n\n" + vmm_real_table(),
    ]
    intro = "vAttention's approach: KV in per-request virtual ranges, physical pages mapped on demand."
    return page("Virtual memory", intro, [PROBE, VMM_KERNELS, VMM_OCCUPANCY, VMM_REAL], sections)


# ---- sharing ------------------------------------------------------------------------------

SHARING = Path("results/reference/sharing-h200")


def sharing_page() -> str:
    rows = []
    for name in ("sharing_real.csv", "sharing_real_sharegpt.csv"):
        for r in csv(SHARING / name).itertuples():
            rows.append(
                [
                    r.workload,
                    r.pattern,
                    r.width,
                    num(r.rate),
                    fixed(r.saved_pct, 1),
                    fixed(r.paper_pct, 1),
                    fixed(r.mean_batched_seqs, 1),
                    r.preemptions,
                ]
            )
    sections = [
        "## Memory saved by parallel sampling and beam search, real decoding\n\n"
        "OPT-13B (random weights, bf16), 12 GiB of KV, paged engine; saved: slots saved by sharing over "
        "the slots the sequences would hold without it, time-weighted over the run. The rate is a fixed "
        "sequence rate divided by the width. The simulated counterparts: "
        "[reproduction.md](reproduction.md#figure-15-memory-saved-by-sharing).\n\n"
        + table(
            [
                "workload",
                "pattern",
                "width",
                "requests/s",
                "saved %",
                "paper %",
                "mean batched sequences",
                "preemptions",
            ],
            rows,
        )
    ]
    return page("Sharing", "KV sharing between the sequences of one request on the GPU.", [SHARING], sections)
