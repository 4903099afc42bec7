"""The KV byte budget, and the GPUs it can be derived from.

Every engine of a run gets the same budget, turned into one arena of
`num_slots = budget_bytes // kv_bytes_per_token` token slots. For models with sliding-window
layers, `budget_by_layer_kind` also splits it into the per-group pools a hybrid allocator keeps.

`--emulate-gpu NAME` derives the budget the way a serving system sizes its cache::

    budget = memory x utilization - weight bytes - activation reserve

with utilization 0.9 (vLLM's default `gpu_memory_utilization`) and an activation reserve
estimated, until the real runner measures it, as the peak of one layer's forward pass
over a full prefill step plus the logits of a full batch::

    reserve = max_num_batched_tokens x (5 x hidden + ffn) x dtype bytes
              + max_num_seqs x vocab x 4 bytes (fp32 logits)

For OPT-13B on an A100-40GB that estimate gives 11.8 GiB (15,512 slots), but the paper's
server left 12 GiB (15,728 slots: Table 1, and the 8.9 % Orca (Max) leaves in Figure 2). Where
the paper published the KV cache of a (model, GPU, GPUs) setting (`paper.TABLE1_KV_GIB`) and
the utilization is the default, `--emulate-gpu` gives that published size instead, and its
`source` says so beside kvbench's own estimate. A model split across N GPUs
(`--tensor-parallel N`) has N times the memory, and N activation reserves (every GPU holds a
whole step's hidden states); the weights are all ranks' together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.kvspec.layers import KVGroup
from kvbench.models import ModelSpec
from kvbench.paper import TABLE1_KV_GIB

GIB = 1 << 30
# the most token slots one arena may have: 16.8 M, four times what any preset needs on a 141 GB
# GPU (Llama-1B-ref: 3.9 M); beyond it a typo (`--kv-cache-gib 1e30`) would build free lists for
# minutes, or exhaust the host's memory, before the first step
MAX_SLOTS = 1 << 24
DEFAULT_UTILIZATION = 0.9  # vLLM's gpu_memory_utilization


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    read_bandwidth: float  # bytes/s, datasheet HBM bandwidth
    fp16_flops: float  # dense fp16/bf16 tensor-core FLOP/s, datasheet


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("a100-40gb", 40 * GIB, 1.555e12, 312e12),
        GpuSpec("a100-80gb", 80 * GIB, 2.039e12, 312e12),
        GpuSpec("h100-80gb", 80 * GIB, 3.35e12, 989e12),
        GpuSpec("h200-141gb", 141 * 10**9, 4.8e12, 989e12),
    )
}


def get_gpu(name: str) -> GpuSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise KvbenchError(f"unknown --emulate-gpu {name!r}; choose one of: {', '.join(GPUS)}") from None


@dataclass(frozen=True)
class KVBudget:
    budget_bytes: int
    num_slots: int
    source: str  # how the budget was obtained, for config.json and reports


def activation_reserve(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    per_token = (5 * model.hidden + model.ffn) * model.dtype_bytes
    return max_num_batched_tokens * per_token + max_num_seqs * model.vocab * 4


def _budget(budget_bytes: float, model: ModelSpec, source: str, param: str) -> KVBudget:
    if model.kv_bytes_per_token <= 0:  # a broken checkpoint config: blame it, not the budget
        raise KvbenchError(
            f"--model {model.name}: {model.kv_bytes_per_token} bytes of K/V per token; its layers, "
            "KV heads and head size must be positive"
        )
    num_slots = int(budget_bytes // model.kv_bytes_per_token)
    if num_slots < 1:
        raise KvbenchError(
            f"{param} leaves {budget_bytes / GIB:.3g} GiB for the KV cache of {model.name}, "
            f"less than one token ({model.kv_bytes_per_token} bytes)"
        )
    if num_slots > MAX_SLOTS:
        count = f"{num_slots:,}" if num_slots < 10**12 else f"{num_slots:.2e}"
        raise KvbenchError(
            f"{param} gives {model.name} {count} token slots, more than kvbench's limit of "
            f"{MAX_SLOTS:,} (kvbench.budget.MAX_SLOTS); give a smaller --kv-cache-gib"
        )
    return KVBudget(int(budget_bytes), num_slots, source)


def check_device_memory(budget: KVBudget, device, ranks: int = 1) -> None:
    """Refuse an arena the device cannot hold, before allocating it: free CUDA memory (after the
    weights), or the host's available memory on the CPU, where an oversized allocation would
    not fail but swap or be killed. `ranks`: GPUs the arena is split over (each holds a share)."""
    share = budget.budget_bytes // ranks
    if device.type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(device)[0]
        where = f"{device} has {free / GIB:.3g} GiB free"
    else:
        free = host_available_bytes()
        where = f"the host has {free / GIB:.3g} GiB available" if free is not None else ""
    if free is not None and share > free:
        raise KvbenchError(
            f"the KV budget ({budget.source}) needs {share / GIB:.3g} GiB but {where}; lower --kv-cache-gib"
        )


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (free and reclaimable memory), None where there is none."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")), None)
    except (OSError, ValueError, IndexError):
        return None


def budget_from_gib(gib: float, model: ModelSpec) -> KVBudget:
    if not math.isfinite(gib) or gib <= 0:
        raise KvbenchError(f"--kv-cache-gib must be a positive number, got {gib}")
    return _budget(gib * GIB, model, f"--kv-cache-gib {gib}", "--kv-cache-gib")


def budget_emulating(
    gpu: GpuSpec,
    model: ModelSpec,
    *,
    utilization: float = DEFAULT_UTILIZATION,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    weight_bytes: int | None = None,
    activation_bytes: int | None = None,
    gpus: int = 1,
) -> KVBudget:
    """The budget a server on `gpus` x `gpu` would leave for KV; weights and activations as measured,
    if known (`activation_bytes`: one GPU's)."""
    if not 0 < utilization <= 1:
        raise KvbenchError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
    if activation_bytes is None:
        reserve, measured = activation_reserve(model, max_num_batched_tokens, max_num_seqs), "estimated"
    else:
        reserve, measured = activation_bytes, "measured"
    weights = model.weight_bytes if weight_bytes is None else weight_bytes
    budget = gpus * gpu.memory_bytes * utilization - weights - gpus * reserve
    how = "measured" if weight_bytes is not None else "fp16"
    times = f"{gpus} x " if gpus > 1 else ""
    source = (
        f"--emulate-gpu {gpu.name}: {times}{gpu.memory_bytes / GIB:.1f} GiB x {utilization} "
        f"- weights {weights / GIB:.2f} GiB ({how}) - activations {times}{reserve / GIB:.2f} GiB ({measured})"
    )
    published = TABLE1_KV_GIB.get((model.name, gpu.name, gpus))
    if published is not None and utilization == DEFAULT_UTILIZATION:
        source = (
            f"--emulate-gpu {gpu.name}: {published} GiB, the PagedAttention paper's KV cache for "
            f"{model.name} on {times}{gpu.name} (its Table 1); kvbench's own estimate: "
            f"{budget / GIB:.2f} GiB "
            f"({source.partition(': ')[2]})"
        )
        budget = published * GIB
    return _budget(budget, model, source, f"--emulate-gpu {gpu.name}")


@dataclass(frozen=True)
class GroupPool:
    """One KV group's share of a budget: `num_slots` tokens of every layer in the group."""

    group: KVGroup
    budget_bytes: int
    num_slots: int


@dataclass(frozen=True)
class LayerKindBudget:
    """One budget two ways, for sequences of `seq_len` tokens: the one arena every engine has today
    (a slot holds a token in every layer, window layers treated as full), and per-group pools as a
    hybrid allocator keeps them (vLLM's hybrid KV cache manager, Jenga), where a sliding-window
    group needs only min(seq_len, window) tokens of a sequence."""

    budget_bytes: int
    seq_len: int
    one_pool_slots: int
    pools: tuple[GroupPool, ...]

    @property
    def one_pool_sequences(self) -> int:
        """Sequences of `seq_len` tokens the one arena holds at once."""
        return self.one_pool_slots // self.seq_len

    @property
    def pooled_sequences(self) -> int:
        """Sequences of `seq_len` tokens the per-group pools hold at once (the scarcest pool's)."""
        return min(pool.num_slots // pool.group.layer.tokens_held(self.seq_len) for pool in self.pools)


def budget_by_layer_kind(budget: KVBudget, model: ModelSpec, seq_len: int) -> LayerKindBudget:
    """`budget` as a one-pool arena and as per-group pools sized for sequences of `seq_len` tokens:
    each group's share is what such a sequence needs of it (its bytes per token x the tokens it
    holds), so every pool fills at the same number of sequences. For a model without window
    layers both are the same arena; for Gemma 3 at 8,192 tokens the pools hold 3.5x the sequences.
    """
    if type(seq_len) is not int or seq_len < 1:
        raise KvbenchError(f"the sequence length to size pools for must be an integer >= 1, got {seq_len!r}")
    total = model.kv_bytes_held(seq_len)
    pools = []
    for group in model.groups:
        share = budget.budget_bytes * group.bytes_held(seq_len) // total
        pools.append(GroupPool(group, share, share // group.bytes_per_token))
    return LayerKindBudget(budget.budget_bytes, seq_len, budget.num_slots, tuple(pools))
