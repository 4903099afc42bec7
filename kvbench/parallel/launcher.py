"""Starting a tensor-parallel group from inside kvbench (rank 0's handle: `session.ParallelSession`).

`session.launch` makes this process rank 0 and spawns ranks 1..N-1 (`torch.multiprocessing`, spawn:
a fresh interpreter each, as CUDA requires), one device each (`cuda:first + rank`, or all on
the CPU). Rendezvous goes through a TCP store that rank 0 opens on a free port of 127.0.0.1
(the OS picks it, so two runs on one host never race for one; `loopback_store`). The group's
backend is gloo on CPU, and on CUDA gloo for host tensors (command headers) with NCCL for
device tensors (inputs, all-reduces). NVLink multicast (NVLS) is switched off for every rank
before NCCL starts.

Shutdown: on success rank 0 sends STOP and joins the workers; on an error it terminates
them (they may be blocked inside a collective). A worker whose parent disappears exits by
itself (`worker._exit_with_parent`), and every collective has the group's timeout, so no
process outlives a crashed run.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from kvbench.errors import KvbenchError
from kvbench.models import ModelSpec
from kvbench.parallel.layers import TensorParallel

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
HOST = "127.0.0.1"  # one host: the store and gloo's sockets stay on loopback
SOCKET_INTERFACES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # where gloo and NCCL listen
# a spawned worker starts as `python -c ...`, which puts the current folder first on the import
# path until the parent's path replaces it: long enough to import a `multiprocessing/` there
SAFE_PATH = {"PYTHONSAFEPATH": "1"}
DEFAULT_TIMEOUT_S = 1800.0  # a collective waiting longer than this fails (torch's default for gloo)


@dataclass(frozen=True)
class WorkerArgs:
    """What rank `rank` needs to build its shard and join the group (pickled to the worker)."""

    rank: int
    size: int
    port: int  # the TCP store's
    parent_pid: int  # rank 0: the worker exits when it goes
    spec: ModelSpec
    dtype: str  # torch dtype name: "float16"
    device: str  # this rank's: "cuda:3", "cpu"
    seed: int  # of the preset's weights
    checkpoint: str | None
    timeout_s: float
    threads: int  # CPU: torch threads of this rank (the ranks share the host's cores); 0: leave as is


def rank_devices(device: torch.device, size: int) -> list[torch.device]:
    """Rank r's device: the CPU for all, or `cuda:(first + r)` from the run's `--device`."""
    if device.type == "cpu":
        return [device] * size
    first, count = device.index or 0, torch.cuda.device_count()
    if first + size > count:
        raise KvbenchError(
            f"--tensor-parallel {size}: needs {size} CUDA devices from cuda:{first}, this machine has {count}"
        )
    return [torch.device("cuda", first + rank) for rank in range(size)]


def connect(
    store: dist.Store, rank: int, size: int, device: torch.device, timeout_s: float
) -> TensorParallel:
    """Join the group as `rank`: gloo on CPU; gloo (host tensors) + NCCL (device tensors) on CUDA."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "gloo" if device.type == "cpu" else "cpu:gloo,cuda:nccl"
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s)
    )
    return TensorParallel(rank, size)


def agree(ok: bool, size: int) -> bool:
    """Whether every rank is `ok` (a host all-reduce: also how rank 0 learns a worker is gone)."""
    flags = torch.tensor([int(ok)])
    dist.all_reduce(flags)
    return int(flags) == size


def loopback_interfaces() -> dict[str, str]:
    """gloo's and NCCL's sockets on the loopback interface, where the user named none.

    Left to choose, gloo listens on the address the host name resolves to and NCCL's bootstrap
    on the first network interface: reachable from the network, for a group that never leaves
    this host. NCCL moves the tensors themselves over NVLink or PCIe either way.
    """
    names = [name for _, name in socket.if_nameindex()]
    loopback = next((name for name in names if name.startswith("lo")), "lo")  # Linux lo, macOS lo0
    return {name: loopback for name in SOCKET_INTERFACES if name not in os.environ}


def loopback_store(size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store, listening on 127.0.0.1 only, on a port the OS picks.

    Given a host name, TCPStore's server still listens on every interface (torch 2.13: `*:port`),
    where anyone on the network could write keys into the group's rendezvous. Handed a socket
    already bound to loopback (`master_listen_fd`, which it takes over: a duplicate of ours),
    it listens there and nowhere else.
    """
    # the libuv server (the default) listens on a handed socket from torch 2.8 (pytorch#150215)
    libuv = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 8)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((HOST, 0))
        listener.listen()
        return dist.TCPStore(
            HOST, listener.getsockname()[1], size, is_master=True, timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False, master_listen_fd=os.dup(listener.fileno()), use_libuv=libuv,
        )  # fmt: skip


def await_workers(store: dist.Store, processes: list, timeout_s: float) -> None:
    """Wait until every worker has reached the store (before joining a group that would wait
    the whole timeout for a worker that died starting)."""
    keys = [f"kvbench/up/{rank}" for rank in range(1, len(processes) + 1)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        dead = [p for p in processes if p.exitcode is not None]
        if dead:
            raise RuntimeError(
                f"tensor-parallel worker {dead[0].name} exited with code {dead[0].exitcode} starting"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"tensor-parallel workers did not start within {timeout_s:g} s")
        time.sleep(0.02)


def stop_workers(processes: list, *, clean: bool) -> None:
    """Join the workers (after STOP), else terminate them; kill what still lingers."""
    for process in processes:
        if not clean:
            process.terminate()
        process.join(timeout=30 if clean else 5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def restore_env(saved_env: dict[str, str | None]) -> None:
    for name, value in saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
