"""Tensor parallelism: a model split over 2 ranks computes what the single-process model computes.

On CPU the ranks talk over gloo; where two GPUs are present the same checks run over NCCL.
Every rank's shard is cut from the same seeded weights, so logits agree to float32 rounding
(the all-reduce sums partial products in another order): within 1e-5 on CPU, 1e-4 on CUDA
(the Triton kernels' dot products may round through TF32), and greedy tokens agree exactly.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engines import ENGINES, EngineOptions
from engines.scheduler import SchedulerConfig
from kvbench.config import RunConfig, prepare
from kvbench.engine import Engine, EngineRun
from kvbench.errors import KvbenchError
from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.parallel.session import launch, open_session
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request, Trace
from tests.support import VIRTUAL_CLOCK, proc_state
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
SEED = 3
TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
ON_GPUS = [pytest.mark.gpu, pytest.mark.skipif(not TWO_GPUS, reason="needs 2 CUDA devices")]
GROUPS = [
    pytest.param("tiny-opt", "cpu", id="opt-gloo"),
    pytest.param("tiny-llama", "cpu", id="llama-gloo"),
    pytest.param("tiny-opt", "cuda", id="opt-nccl", marks=ON_GPUS),
    pytest.param("tiny-llama", "cuda", id="llama-nccl", marks=ON_GPUS),
]
ENGINE_NAMES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")


def attention_of(device: torch.device) -> str:
    return "triton" if device.type == "cuda" else "torch"


@pytest.mark.parametrize("model, device", GROUPS)
def test_a_split_model_computes_what_one_process_does(model, device):
    """One group per model (starting one is most of the cost), every check through it."""
    with open_session(
        model,
        get_model(model),
        tensor_parallel=2,
        dtype=torch.float32,
        device=torch.device(device),
        seed=SEED,
    ) as group:
        check_logits(group, paged=True)
        check_logits(group, paged=False)
        check_copy_on_write(group)
        expected = single_process_tokens(group)
        check_every_engine(group, expected)
        check_swaps(group, expected)
        check_real_run(group)


def check_logits(group, *, paged: bool) -> None:
    """Two sequences prefilled in two chunks (the second attends to the stored first), then decoded."""
    spec, device = group.model.spec, group.device
    single = random_model(spec, torch.float32, device, SEED)
    single_arena = KVArena(spec, 64, torch.float32, device)
    arena = group.arena(64)
    tables = torch.tensor([[5, 2, 7], [0, 3, 6]], dtype=torch.int32, device=device)
    starts = torch.tensor([8, 40], device=device)
    addressing = {"block_tables": tables, "block_size": 4} if paged else {"starts": starts}
    ids = torch.randint(0, spec.vocab, (2, 9), generator=torch.Generator().manual_seed(1)).to(device)
    bound = 1e-4 if device.type == "cuda" else 1e-5

    def slots(lo: int, hi: int) -> torch.Tensor:
        pos = torch.arange(lo, hi, device=device)
        if paged:
            return torch.cat([tables[b, pos // 4].long() * 4 + pos % 4 for b in range(2)])
        return torch.cat([starts[b] + pos for b in range(2)])

    with torch.inference_mode():
        for lo, hi in [(0, 3), (3, 5), *((step, step + 1) for step in range(5, 9))]:
            n = hi - lo
            meta = AttentionMetadata(
                n > 1, slots(lo, hi), torch.tensor([0, n, 2 * n], device=device),
                torch.tensor([hi, hi], dtype=torch.int32, device=device), max_new=n, num_splits=2,
                backend=attention_of(device), **addressing,
            )  # fmt: skip
            positions = torch.arange(lo, hi, device=device).repeat(2)
            split = group.model(ids[:, lo:hi].reshape(-1), positions, meta, arena)  # [2, V]
            whole = single(ids[:, lo:hi].reshape(-1), positions, meta, single_arena)  # [2, V]
            assert (split - whole).abs().max().item() < bound, f"positions {lo}..{hi - 1}"


def check_copy_on_write(group) -> None:
    """A block copy made by rank 0's runner reaches the workers: decoding from the copies (never
    written by a forward) gives the single-process logits only if every rank copied its heads."""
    spec, device = group.model.spec, group.device
    blocks = SimpleNamespace(block_size=4, num_host_blocks=0)  # what the runner asks of an allocator
    options = dict(max_batch=1, max_len=16, attention=attention_of(device))
    single = ModelRunner(
        random_model(spec, torch.float32, device, SEED), KVArena(spec, 32, torch.float32, device), blocks,
        cuda_graphs=False, **options,
    )  # fmt: skip
    split = group.runner(group.arena(32), blocks, **options)
    ids = torch.randint(0, spec.vocab, (9,), generator=torch.Generator().manual_seed(2)).to(device)
    logits = []
    for runner in (single, split):
        with torch.inference_mode():
            for step, table in ((slice(0, 8), [1, 2, 3]), (slice(8, 9), [5, 6, 7])):
                if step.start == 8:
                    runner._copy_blocks(((1, 5), (2, 6)))  # positions 0..7 now also in blocks 5, 6
                positions = torch.arange(step.start, step.stop, device=device)
                tables = torch.tensor([table], dtype=torch.int32, device=device)
                n = len(positions)
                meta = AttentionMetadata(
                    n > 1, tables[0, positions // 4].long() * 4 + positions % 4,
                    torch.tensor([0, n], device=device),
                    torch.tensor([step.stop], dtype=torch.int32, device=device),
                    block_tables=tables, block_size=4, max_new=n, num_splits=2, backend=attention_of(device),
                )  # fmt: skip
                out = runner.model(ids[step], positions, meta, runner.arena)
        logits.append(out)
    assert (logits[0] - logits[1]).abs().max().item() < (1e-4 if device.type == "cuda" else 1e-5)


def small_trace(count: int = 8) -> Trace:
    rng = np.random.default_rng(0)
    lengths = zip(rng.integers(3, 24, count), rng.integers(1, 16, count), strict=True)
    return Trace("small", tuple(Request(i, 0.01 * i, int(p), int(o)) for i, (p, o) in enumerate(lengths)))


def decode(engine: str, num_slots: int, *, session=None, spec=None, device=CPU, **options) -> EngineRun:
    """The small trace's greedy decoding: through `session`'s split model, else one process's.
    Steps last what the virtual clock prices: which requests batch, wait or swap is the same
    however slow the ranks' messages are on a loaded machine."""
    host_blocks = options.pop("host_blocks", 0)
    engine_options = EngineOptions(
        num_slots=num_slots, max_len=64, block_size=4, host_blocks=host_blocks,
        scheduler=SchedulerConfig(preemption=options.pop("preemption", "recompute")),
    )  # fmt: skip
    scheduler = ENGINES[engine].build(engine_options)
    kwargs = dict(max_batch=10, max_len=64, seed=5, attention=attention_of(device), clock=VIRTUAL_CLOCK)
    if session is None:
        model = random_model(spec, torch.float32, device, SEED)
        arena = KVArena(spec, num_slots, torch.float32, device)
        runner = ModelRunner(model, arena, scheduler.allocator, cuda_graphs=False, **kwargs)
    else:
        runner = session.runner(session.arena(num_slots), scheduler.allocator, **kwargs)
    return Engine(scheduler, runner, **options).run(small_trace())


def single_process_tokens(group) -> list[list[int]]:
    """The single-process model's greedy tokens for the small trace (engines agree: test_modeling)."""
    run = decode("paged", 1024, spec=group.model.spec, device=group.device)
    assert all(seq.output_ids for seq in run.sequences)
    return [seq.output_ids for seq in run.sequences]


def check_every_engine(group, expected: list[list[int]]) -> None:
    """Greedy tokens through the real runner, every engine (multi-step segments included)."""
    device = group.device
    for engine in ENGINE_NAMES:
        run = decode(engine, 300, session=group, device=device)
        assert [s.output_ids for s in run.sequences] == expected, engine
        assert any(row.num_steps > 1 for row in run.steps)  # multi-step decode segments ran


def check_swaps(group, expected: list[list[int]]) -> None:
    """Swap preemption: rank 0 sends each swap to the workers, which move their heads' K/V too."""
    run = decode("paged", 48, session=group, device=group.device, preemption="swap", host_blocks=64)
    assert any(row.num_swapped for row in run.steps)  # the case is exercised (virtual clock: always)
    assert [s.output_ids for s in run.sequences] == expected


def check_real_run(group) -> None:
    """`run_real` on the split model: the same tokens, and budget and slots counted per model.

    `run_real` times steps by the wall clock, and the split model's steps are slower (every
    layer waits for the other rank), so requests arriving while the runs decode would join
    different batches in each. At 1e6 requests/s all six arrive within the first step: both
    runs admit by memory alone, batch for batch the same, and their tokens differ only by
    what the split computes, at the group's dtype."""
    from kvbench.real.run import run_real

    workload = WorkloadSpec("uniform:prompt=4..20,output=2..8", num_requests=6, rate=1e6)
    device = group.device.type
    base = dict(
        engine="orca-oracle", model=group.model.spec.name, workload=workload, kv_cache_gib=0.0005,
        device=device, dtype="float32", attention=attention_of(group.device), collectors="none",
        weights_seed=SEED,
    )  # fmt: skip
    single = run_real(RunConfig(**base))
    split = run_real(RunConfig(**base, tensor_parallel=2), session=group)
    assert [s.output_ids for s in split.run.sequences] == [s.output_ids for s in single.run.sequences]
    batches = [[(r.kind, r.batch_size, r.num_steps) for r in run.run.steps] for run in (single, split)]
    assert batches[0] == batches[1]  # the same batches: the tokens' comparison is the model's alone
    one, two = single.summary, split.summary
    assert two["tensor_parallel"] == 2 and two["completed"] == 6 and not two["cuda_graphs"]
    for key in ("kv_budget_bytes", "num_slots", "arena_slots", "arena_bytes"):  # per model, not per rank
        assert two[key] == one[key], key
    assert two["weight_bytes"] > one["weight_bytes"]  # embeddings and head live on both ranks


def _workers() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("kvbench-tp")]


def test_a_degree_that_does_not_divide_the_heads_is_a_one_line_error(tmp_path):
    before = set(_workers())
    for model, size, counts in [
        ("tiny-opt", 3, "4 attention heads and 4 KV heads"),
        ("tiny-llama", 4, "2 KV"),
    ]:
        with pytest.raises(KvbenchError, match=f"--tensor-parallel {size}: {model} has .*{counts}") as error:
            prepare(RunConfig(engine="paged", model=model, tensor_parallel=size))
        assert "\n" not in str(error.value)
        with pytest.raises(KvbenchError, match=f"--tensor-parallel {size}"):
            launch(get_model(model), size=size, device=CPU, dtype=torch.float32)
    assert set(_workers()) == before  # refused before starting anything
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", "run", "--engine", "paged", "--model", "tiny-opt", "--device",
         "cpu", "--tensor-parallel", "3", "--out", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith("error: --tensor-parallel 3: tiny-opt has 4")
    assert len(proc.stderr.strip().splitlines()) == 1


# run in a fresh interpreter: a process holds one group at a time, and this one kills processes
BROKEN_GROUPS = """
import os, signal, torch
from kvbench.models import get_model
from kvbench.parallel.session import launch

def start():
    spec = get_model("tiny-opt")
    return launch(spec, size=2, device=torch.device("cpu"), dtype=torch.float32, timeout_s=600)

if __name__ == "__main__":
    with start() as session:  # a worker is killed: rank 0's next command says so at once
        os.kill(session.processes[0].pid, signal.SIGKILL)
        try:
            session.arena(16)
        except RuntimeError as error:
            print(error, flush=True)
    session = start()  # rank 0 is killed: its worker must not linger
    print(session.processes[0].pid, flush=True)
    os._exit(3)
"""


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    return proc_state(pid) in (None, "Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_dead_worker_is_reported_and_a_dead_rank_zero_leaves_no_worker(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_GROUPS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )  # a safety net: two groups of fresh interpreters start slowly on a loaded 2-core machine
    assert proc.returncode == 3, proc.stderr
    error, pid = proc.stdout.splitlines()
    assert error.startswith("the tensor-parallel group broke: kvbench-tp1 (exit code -9)")
    deadline = time.monotonic() + 300  # a safety net: the worker's exit is what is awaited
    while not _gone(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(int(pid)), "the worker outlived rank 0"
