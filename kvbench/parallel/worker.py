"""Ranks 1..N-1: build a shard, then do what rank 0 says until it says STOP.

A worker holds no scheduler, allocator or sampler. It receives each forward's inputs and runs
its shard's layers on them (`CausalLM.hidden_states`: the head and sampling are rank 0's),
meeting the other ranks in the row-parallel all-reduces. The arena operations rank 0's
runner does outside the model (swaps to host memory, copy-on-write block copies) arrive as
commands and run through the same `ModelRunner` methods on this rank's arena.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from engines.batch import Batch
from kvbench.modeling.arena import KVArena
from kvbench.modeling.causal_lm import CausalLM
from kvbench.parallel.channel import Channel, Command, Mirror, decode_forward, decode_mirror
from kvbench.parallel.launcher import HOST, NVLS_OFF, WorkerArgs, agree, connect
from kvbench.parallel.layers import TensorParallel
from kvbench.parallel.shard import build_shard
from kvbench.real.model_runner import ModelRunner


def main(args: WorkerArgs) -> None:
    """The spawned process's entry point."""
    _exit_with_parent(args.parent_pid)
    os.environ.update(NVLS_OFF)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    timeout = timedelta(seconds=args.timeout_s)
    store = dist.TCPStore(HOST, args.port, args.size, is_master=False, timeout=timeout)
    store.set(f"kvbench/up/{args.rank}", "1")
    tp = connect(store, args.rank, args.size, device, args.timeout_s)
    try:
        dtype = getattr(torch, args.dtype)
        checkpoint = None if args.checkpoint is None else Path(args.checkpoint)
        shard = build_shard(args.spec, tp, dtype, device, seed=args.seed, checkpoint=checkpoint)
        if agree(True, tp.size):
            serve(shard, tp, dtype, device)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank; rank 0 reports it
        pass
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class _Blocks:
    """What `ModelRunner`'s arena operations ask of an allocator."""

    block_size: int
    num_host_blocks: int


@torch.inference_mode()
def serve(shard: CausalLM, tp: TensorParallel, dtype: torch.dtype, device: torch.device) -> None:
    """Run commands until STOP."""
    channel = Channel(device)
    arena: KVArena | None = None
    mirror: ModelRunner | None = None  # this rank's swaps and block copies (host buffers included)
    while True:
        try:
            message = channel.recv()
        except RuntimeError as error:  # rank 0 (or another worker) is gone: nothing left to do
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            print(f"kvbench tensor-parallel rank {tp.rank}: the group broke ({first})", file=sys.stderr)
            return
        command = message.command
        if command == Command.STOP:
            return
        if command == Command.ARENA:
            arena = mirror = None  # free the old one first
            try:
                arena = KVArena(shard.spec, message.ints[0], dtype, device, tp_size=tp.size)
            except torch.OutOfMemoryError:
                arena = None
            agree(arena is not None, tp.size)
        elif command == Command.FORWARD:
            input_ids, positions, meta = decode_forward(message)
            shard.hidden_states(input_ids, positions, meta, arena)
        else:  # MIRROR: an arena operation rank 0's runner does outside a forward
            try:
                op, block_size, host_blocks, rows = decode_mirror(message)
            except ValueError as error:  # never executed, never guessed at: the group stops
                print(f"kvbench tensor-parallel rank {tp.rank}: refused a message ({error})", file=sys.stderr)
                return
            if mirror is None:
                # no warm-up: a forward of this rank alone would wait on collectives no other rank enters
                mirror = ModelRunner(
                    shard, arena, _Blocks(block_size, host_blocks), max_batch=1, max_len=block_size,
                    attention="torch", cuda_graphs=False, warm_up=False,
                )  # fmt: skip
            if op == Mirror.SWAP:
                mirror._swap(Batch((), False, 0, 0, swaps=tuple((bool(t), s, d) for t, s, d in rows)))
            else:
                mirror._copy_blocks(rows)


def _exit_with_parent(parent_pid: int) -> None:
    """Exit as soon as rank 0's process is gone (killed, crashed): never outlive a run."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="kvbench-tp-parent", daemon=True).start()
