"""The Session seam real runs build on: where the model lives, and how arenas and runners are made.

A run asks its session for the model (rank 0's view), an arena of the budget's slots, and a
runner per engine. `LocalSession` is one process (the model and arena on one device);
`ParallelSession` is rank 0 of a tensor-parallel group, whose arena holds this
rank's KV heads of every slot and whose runner drives the workers. Budgets and slot counts
are the whole model's either way: one slot is one token's K/V on every rank.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvbench.errors import KvbenchError
from kvbench.modeling.arena import KVArena
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.weights import load_checkpoint, random_model
from kvbench.models import ModelSpec
from kvbench.parallel import worker  # the spawned processes' entry point
from kvbench.parallel.channel import Channel, Command
from kvbench.parallel.launcher import (
    DEFAULT_TIMEOUT_S,
    NVLS_OFF,
    SAFE_PATH,
    WorkerArgs,
    agree,
    await_workers,
    connect,
    loopback_interfaces,
    loopback_store,
    rank_devices,
    restore_env,
    stop_workers,
)  # fmt: skip
from kvbench.parallel.layers import TensorParallel
from kvbench.parallel.runner import ParallelModel, ParallelRunner
from kvbench.parallel.shard import build_shard
from kvbench.parallel.sizes import check_tensor_parallel
from kvbench.real.model_runner import ModelRunner


class Session(Protocol):
    model: CausalLM  # what the runner calls (rank 0's under tensor parallelism)
    size: int  # processes (GPUs) the model is split across
    weight_bytes: int  # on all of them together

    def arena(self, num_slots: int) -> KVArena:
        """A fresh arena of `num_slots` token slots (this rank's part of each)."""
        ...

    def runner(self, arena: KVArena, allocator, **options) -> ModelRunner:
        """The engine's runner over `arena`; `options` as `ModelRunner`'s keywords."""
        ...


class LocalSession:
    """One process: the model and its arena on one device."""

    size = 1

    def __init__(self, model: CausalLM, dtype: torch.dtype, device: torch.device) -> None:
        self.model, self.dtype, self.device = model, dtype, device
        self.weight_bytes = sum(p.nbytes for p in model.parameters())  # tied parameters once

    def arena(self, num_slots: int) -> KVArena:
        return KVArena(self.model.spec, num_slots, self.dtype, self.device)

    def runner(self, arena: KVArena, allocator, **options) -> ModelRunner:
        return ModelRunner(self.model, arena, allocator, **options)


WATCH_GRACE_S = 10.0  # after a worker's death, how long the error has to surface before rank 0 exits


class ParallelSession:
    """Rank 0's handle: the model (`ParallelModel`), arenas and runners, commands, shutdown."""

    def __init__(
        self, tp: TensorParallel, device: torch.device, dtype: torch.dtype, processes: list, saved_env: dict,
        saved_threads: int,
    ) -> None:  # fmt: skip
        self.tp, self.device, self.dtype = tp, device, dtype
        self.size = tp.size
        self.processes = processes
        self.channel = Channel(device)
        self.current: KVArena | None = None  # the arena every rank holds now
        self._saved_env, self._saved_threads = saved_env, saved_threads  # restored at close
        self._closed = False

    def start(self, shard: CausalLM) -> None:
        """Take rank 0's shard once every rank has built its own."""
        if not self._agree(True):
            raise RuntimeError("a tensor-parallel worker could not build its shard (its error is above)")
        self.model = ParallelModel(shard, self)
        # every rank holds a shard of this size (replicated embeddings and head included)
        self.weight_bytes = self.size * sum(p.nbytes for p in shard.parameters())
        if self.device.type == "cuda":
            threading.Thread(target=self._watch_workers, name="kvbench-tp-watch", daemon=True).start()

    def _watch_workers(self) -> None:
        """CUDA: after a worker dies, rank 0 may sit in a device sync until NCCL's timeout (half an
        hour); end the process instead, unless the failure surfaced and the session closed."""
        while not self._closed:
            dead = [p for p in self.processes if p.exitcode is not None]
            if dead:
                time.sleep(WATCH_GRACE_S)
                if not self._closed:
                    print(
                        f"kvbench: tensor-parallel {dead[0].name} exited (code {dead[0].exitcode}); "
                        "stopping the group",
                        file=sys.stderr,
                        flush=True,
                    )
                    stop_workers(self.processes, clean=False)
                    os._exit(1)
            time.sleep(0.5)

    def send(self, command: Command, ints=(), tensors=()) -> None:
        try:
            self.channel.send(command, ints, tensors)
        except RuntimeError as error:
            raise self._worker_error() from error

    def arena(self, num_slots: int) -> KVArena:
        """A fresh arena of `num_slots` on every rank (each with its KV heads); the old one is freed.
        Raises `torch.OutOfMemoryError` when any rank cannot hold it."""
        self.current = None
        self.send(Command.ARENA, (num_slots,))
        try:
            arena = KVArena(self.model.spec, num_slots, self.dtype, self.device, tp_size=self.size)
        except torch.OutOfMemoryError:
            arena = None
        if not self._agree(arena is not None):
            raise torch.OutOfMemoryError(f"a KV arena of {num_slots} slots does not fit on every rank")
        self.current = arena
        return arena

    def runner(self, arena: KVArena, allocator, **options) -> ParallelRunner:
        """A `ParallelRunner` over `arena` (the group's current arena); `options` as `ModelRunner`'s."""
        if arena is not self.current:
            raise ValueError("a tensor-parallel runner needs the session's current arena")
        return ParallelRunner(self, arena, allocator, **options)

    def _agree(self, ok: bool) -> bool:
        try:
            return agree(ok, self.size)
        except RuntimeError as error:
            raise self._worker_error() from error

    def _worker_error(self) -> RuntimeError:
        """What went wrong with the workers, once a collective with them failed."""
        for process in self.processes:
            process.join(timeout=1)
        dead = [f"{p.name} (exit code {p.exitcode})" for p in self.processes if p.exitcode is not None]
        where = ", ".join(dead) if dead else "no worker has exited"
        return RuntimeError(f"the tensor-parallel group broke: {where}; any worker traceback is above")

    def close(self, *, clean: bool = True) -> None:
        """Stop the workers (STOP, or terminate after an error) and leave the group."""
        if self._closed:
            return
        self._closed = True
        self.current = None
        if clean:
            try:
                self.channel.send(Command.STOP)
            except RuntimeError:
                clean = False
        stop_workers(self.processes, clean=clean)
        dist.destroy_process_group()
        restore_env(self._saved_env)
        torch.set_num_threads(self._saved_threads)

    def __enter__(self) -> ParallelSession:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.close(clean=kind is None)


@contextmanager
def open_session(
    model: str, spec: ModelSpec, *, tensor_parallel: int, dtype: torch.dtype, device: torch.device, seed: int
) -> Iterator[Session]:
    """The run's model (`--model`: a preset with seeded weights, or a checkpoint folder), in one
    process or split across `tensor_parallel` (workers stopped when the block ends)."""
    checkpoint = Path(model) if Path(model).is_dir() else None
    if tensor_parallel == 1:
        weights = (
            load_checkpoint(checkpoint, dtype, device)
            if checkpoint
            else random_model(spec, dtype, device, seed)
        )
        yield LocalSession(weights, dtype, device)
        return
    with launch(
        spec, size=tensor_parallel, device=device, dtype=dtype, seed=seed, checkpoint=checkpoint
    ) as session:
        yield session


def launch(
    spec: ModelSpec, *, size: int, device: torch.device, dtype: torch.dtype, seed: int = 0,
    checkpoint: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ParallelSession:  # fmt: skip
    """Spawn the workers, build every rank's shard, and return rank 0's session (a context manager)."""
    check_tensor_parallel(spec, size)
    devices = rank_devices(device, size)
    if dist.is_initialized():
        raise KvbenchError(
            f"--tensor-parallel {size}: torch.distributed is already initialised in this process"
        )
    settings = {**NVLS_OFF, **loopback_interfaces(), **SAFE_PATH}
    saved_env = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)  # inherited by the workers; gloo and NCCL read them when they start
    saved_threads = torch.get_num_threads()
    threads = max(1, saved_threads // size) if device.type == "cpu" else 0
    store = loopback_store(size, timeout_s)
    context = mp.get_context("spawn")
    processes = []
    session = None
    try:
        for rank in range(1, size):
            args = WorkerArgs(
                rank, size, store.port, os.getpid(), spec, str(dtype).removeprefix("torch."),
                str(devices[rank]), seed, None if checkpoint is None else str(checkpoint), timeout_s, threads,
            )  # fmt: skip
            process = context.Process(target=worker.main, args=(args,), name=f"kvbench-tp{rank}", daemon=True)
            process.start()
            processes.append(process)
        await_workers(store, processes, timeout_s)
        tp = connect(store, 0, size, devices[0], timeout_s)
        session = ParallelSession(tp, devices[0], dtype, processes, saved_env, saved_threads)
        if threads:
            torch.set_num_threads(threads)  # until the session closes
        shard = build_shard(spec, tp, dtype, devices[0], seed=seed, checkpoint=checkpoint)
        session.start(shard)
        return session
    except BaseException:
        if session is not None:
            session.close(clean=False)
        else:
            stop_workers(processes, clean=False)
            if dist.is_initialized():
                dist.destroy_process_group()
            restore_env(saved_env)
        raise
