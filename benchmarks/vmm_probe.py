"""What CUDA virtual memory costs on this GPU: the numbers a virtual-memory KV arena rests on.

Measures, through `kvbench.vmm.driver` (ctypes on libcuda):
- the allocation granularity (the smallest physical page);
- creating a page and mapping it (create + map + set access), per page, into one reservation;
- re-mapping pages already created (map + set access, then unmap), per page, the cost a
  reclaiming allocator pays when it reuses handles;
- mapping k pages with one call (one handle of k pages) against k calls of one page;
- whether map and unmap wait for the GPU (timed while a long matrix-product queue runs);
- that memory returns (`torch.cuda.mem_get_info`) once pages are unmapped and released;
- correctness: a tensor viewed over the range reads back what was written, and a CUDA graph
  captured over the range keeps working after a page under it is unmapped and a different
  page is mapped in its place (the addresses never move, so graphs stay valid).

    python benchmarks/vmm_probe.py [--pages 512] [--pairs 1000] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kvbench.vmm.driver import Driver, view


def _us(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "median_us": round(1e6 * statistics.median(ordered), 1),
        "p99_us": round(1e6 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "mean_us": round(1e6 * statistics.fmean(ordered), 1),
        "max_us": round(1e6 * ordered[-1], 1),
    }


def create_and_map(drv: Driver, base: int, page: int, pages: int) -> tuple[list[int], dict, dict]:
    handles, create, mapping = [], [], []
    for i in range(pages):
        t0 = time.perf_counter()
        handle = drv.create(page)
        t1 = time.perf_counter()
        drv.map(base + i * page, page, handle)
        t2 = time.perf_counter()
        handles.append(handle)
        create.append(t1 - t0)
        mapping.append(t2 - t1)
    return handles, _us(create), _us(mapping)


def remap_pairs(drv: Driver, base: int, page: int, handles: list[int], pairs: int) -> tuple[dict, dict]:
    """Unmap then map again the same address, cycling through the handles."""
    maps, unmaps = [], []
    for i in range(pairs):
        k = i % len(handles)
        addr = base + k * page
        t0 = time.perf_counter()
        drv.unmap(addr, page)
        t1 = time.perf_counter()
        drv.map(addr, page, handles[k])
        t2 = time.perf_counter()
        unmaps.append(t1 - t0)
        maps.append(t2 - t1)
    return _us(maps), _us(unmaps)


def batched(drv: Driver, page: int, sizes=(1, 8, 64), repeats: int = 5) -> list[dict]:
    """k pages mapped as one handle in one call, against k one-page calls (median of repeats)."""
    runs = [_batched_once(drv, page, sizes) for _ in range(repeats)]
    return [
        {key: statistics.median(run[i][key] for run in runs) for key in runs[0][i]} for i in range(len(sizes))
    ]


def _batched_once(drv: Driver, page: int, sizes) -> list[dict]:
    rows = []
    for k in sizes:
        size = k * page
        base = drv.reserve(size, page)
        one = drv.create(size)
        t0 = time.perf_counter()
        drv.map(base, size, one)
        t1 = time.perf_counter()
        drv.unmap(base, size)
        drv.release(one)
        singles = [drv.create(page) for _ in range(k)]
        t2 = time.perf_counter()
        for i, h in enumerate(singles):
            drv.map(base + i * page, page, h)
        t3 = time.perf_counter()
        drv.unmap(base, size)
        for h in singles:
            drv.release(h)
        drv.free(base, size)
        one_us, k_us = round(1e6 * (t1 - t0), 1), round(1e6 * (t3 - t2), 1)
        rows.append({"pages": k, "one_call_us": one_us, "k_calls_us": k_us})
    return rows


def while_busy(drv: Driver, page: int) -> dict:
    """Do map and unmap wait for queued GPU work? Queue ~0.2 s of matrix products, then time them."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    a @ a  # cuBLAS's first-call set-up, outside the estimate
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    per_product = (time.perf_counter() - t0) / 10
    reps = max(1, int(0.2 / per_product))
    base = drv.reserve(2 * page, page)
    handles = [drv.create(page) for _ in range(2)]
    drv.map(base, page, handles[0])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ a
    queued = time.perf_counter() - start
    t0 = time.perf_counter()
    drv.map(base + page, page, handles[1])
    t1 = time.perf_counter()
    drv.unmap(base + page, page)
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    drained = time.perf_counter()
    drv.unmap(base, page)
    for h in handles:
        drv.release(h)
    drv.free(base, 2 * page)
    return {
        "queued_gpu_work_ms": round(1e3 * reps * per_product, 1),
        "host_time_to_queue_ms": round(1e3 * queued, 1),
        "map_while_busy_us": round(1e6 * (t1 - t0), 1),
        "unmap_while_busy_us": round(1e6 * (t2 - t1), 1),
        "gpu_still_busy_after_ms": round(1e3 * (drained - t2), 1),
    }


def graph_survives_remap(drv: Driver, page: int) -> dict:
    """Capture a graph that sums a range of two pages; swap the second page for another; replay."""
    n = 2 * page // 4  # float32 elements over two pages
    base = drv.reserve(2 * page, page)
    h0, h1, h2 = (drv.create(page) for _ in range(3))
    drv.map(base, page, h0)
    drv.map(base + page, page, h1)
    x = view(base, (n,), torch.float32)
    x.fill_(1.0)
    out = torch.zeros((), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out.copy_(x.sum())  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(x.sum())
    graph.replay()
    torch.cuda.synchronize()
    before = float(out)
    drv.unmap(base + page, page)
    drv.map(base + page, page, h2)
    x[n // 2 :].fill_(3.0)  # the new page under the same addresses
    graph.replay()
    torch.cuda.synchronize()
    after = float(out)
    ok = before == n and after == n // 2 * 1.0 + n // 2 * 3.0
    del x
    drv.unmap(base, 2 * page)
    for h in (h0, h1, h2):
        drv.release(h)
    drv.free(base, 2 * page)
    return {"sum_before": before, "sum_after": after, "expected_after": n // 2 * 4.0, "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=512)
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # torch's primary context, current in this thread
    drv = Driver(torch.cuda.current_device())
    page = drv.granularity()
    result: dict = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "granularity_bytes": page,
        "recommended_granularity_bytes": drv.granularity(recommended=True),
    }
    free0, _ = torch.cuda.mem_get_info()
    base = drv.reserve(args.pages * page, page)
    handles, create, mapping = create_and_map(drv, base, page, args.pages)
    free1, _ = torch.cuda.mem_get_info()
    result["create_per_page"] = create
    result["map_set_access_per_page"] = mapping
    tensor = view(base, (args.pages * page,), torch.uint8)
    tensor.fill_(7)
    result["view_reads_back"] = bool((tensor[:: page // 2] == 7).all())
    del tensor
    maps, unmaps = remap_pairs(drv, base, page, handles, args.pairs)
    result["remap_map_set_access"] = maps
    result["remap_unmap"] = unmaps
    t0 = time.perf_counter()
    drv.unmap(base, args.pages * page)
    t1 = time.perf_counter()
    for h in handles:
        drv.release(h)
    t2 = time.perf_counter()
    drv.free(base, args.pages * page)
    free2, _ = torch.cuda.mem_get_info()
    result["unmap_all_us_per_page"] = round(1e6 * (t1 - t0) / args.pages, 2)
    result["release_us_per_page"] = round(1e6 * (t2 - t1) / args.pages, 2)
    result["memory"] = {
        "mapped_bytes": args.pages * page,
        "free_drop_when_mapped": free0 - free1,
        "free_returned_after_release": free2 - free1,
    }
    result["one_handle_vs_k_pages"] = batched(drv, page)
    result["while_gpu_busy"] = while_busy(drv, page)
    result["graph_after_remap"] = graph_survives_remap(drv, page)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
