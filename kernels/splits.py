"""How many split-KV partitions a decode launch uses, and where their partials wait to be merged.

Triton-free: the runner sizes graphs and allocates the workspace with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

PROGRAMS_PER_SM = 4  # (batch, KV head, split) programs per SM a small grid is split up to
MIN_SPLIT_TOKENS = 128  # two tiles of the small grid's launch: below, a split is mostly overhead
MAX_SPLITS = 16  # the K/V kernels' cap (`choose_num_splits`)
MLA_MAX_SPLITS = 128  # the MLA kernel's cap (`choose_mla_splits`)
HEADS_PER_PROGRAM = 16  # MLA query heads sharing each loaded tile (tl.dot pads a group to 16 rows anyway)
# (context positions per loop iteration, warps, pipeline stages), by grid size; tuned on an H200
# (benchmarks/tune_decode.py, results/reference/kernel-tuning/README.md)
SMALL_GRID_LAUNCH = (64, 4, 2)  # up to PROGRAMS_PER_SM programs per SM
LARGE_GRID_LAUNCH = (128, 4, 2)  # more programs than that: batch x KV heads fill the GPU alone


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(
    batch: int, kv_heads: int, max_context: int, device: torch.device, *, cap: int = MAX_SPLITS
) -> int:
    """The largest power of two of splits, at most `cap`, that keeps the grid within 4 programs
    per SM, none under 128 tokens.

    Why 4 with 64-position tiles: on an H200 every cell of the benchmark's 64K-token band
    ((8, 8192) to (64, 1024)) read fastest at 512 programs of 64-position tiles (0.81-0.87 of
    the read bandwidth), and cells of 256K tokens and more did as well or better than with the
    earlier rule (8 programs per SM, rounded up): more splits only added merge work and
    partial tiles. A batch whose batch x KV heads already exceeds the budget is not split.
    On CPU (the interpreter) a few splits keep the merge path exercised.
    """
    if device.type != "cuda":
        return min(4, cap, max(1, max_context // MIN_SPLIT_TOKENS))
    return split_count(batch * kv_heads, max_context, _sm_count(device), cap)


def split_count(rows: int, max_context: int, sms: int, cap: int = MAX_SPLITS) -> int:
    """`choose_num_splits` on a GPU of `sms` multiprocessors for `rows` (sequence, KV head) pairs."""
    longest = max(1, max_context // MIN_SPLIT_TOKENS)
    room = PROGRAMS_PER_SM * sms // max(rows, 1)
    return 1 << (max(1, min(room, longest, cap)).bit_length() - 1)  # round down to a power of two


def mixed_step_launches(kv_heads: int, sms: int, cap: int = MAX_SPLITS) -> tuple[tuple[int, int], ...]:
    """(decode rows, splits) of one launch per decode-kernel variant a mixed step's decode rows
    can take: every power of two of splits up to `cap` (a row of `splits` x 128 positions, on
    the small grid), then enough unsplit rows to pass the small grid (the large launch).

    Why: a chunked step runs its decode rows eagerly, through the split kernel, with the split
    count `split_count` picks for that step (`NUM_SPLITS` and the launch are compile-time), so
    each count a run meets first compiles mid-run: on an H200, Gemma 3 12B's first mixed steps
    of a new count took 1.1-1.7 s instead of 0.19 (results/reference/hybrid-long-chunked-split-real).
    A warm-up over these launches compiles them before the first timed step."""
    counts = [1 << i for i in range(cap.bit_length()) if 1 << i <= cap]
    return (*((1, s) for s in counts), (PROGRAMS_PER_SM * sms // max(kv_heads, 1) + 1, 1))


def head_groups(heads: int) -> int:
    """MLA programs per (sequence, split) along the query heads: what `DecodeWorkspace` counts
    as KV heads for the MLA kernel."""
    return -(-heads // HEADS_PER_PROGRAM)


def choose_mla_splits(batch: int, heads: int, max_context: int, device: torch.device) -> int:
    """`choose_num_splits` for the MLA kernel (`heads` query heads): the same rule, capped at
    `MLA_MAX_SPLITS` instead of `MAX_SPLITS`.

    Why its own cap: one MLA program serves a whole head group (all 16 heads of V2-Lite), so
    its grid is batch x splits alone. Capped at 16, a batch of 8 launched 128 programs on the
    H200's 132 SMs and read at 28-43 % of the bandwidth (results/reference/kernels-window-mla),
    where the K/V kernel's batch of 8 runs 8 KV heads x 8 splits. With 128, batches of 4 to 32
    split up to 4 programs per SM wherever the context gives every split 128 tokens (a batch of
    8: 64 splits, 512 programs, from 8,192 tokens on), and 1 or 2 sequences to 1 or 2 programs
    per SM; from 33 sequences on no more than 16 splits fit, and the count is the K/V rule's.

    The workspace does not grow with the cap: rows x splits stay within 4 x SMs, so a launch's
    partials within 4 x SMs x 16 heads x latent floats (16.5 MiB at 132 SMs and a latent of
    512). The price is merge work: each split leaves a `[16, latent]` float32 partial (32 KiB at
    512), about a fifth of the bytes a split of 128 tokens reads (147 KiB), mostly through L2.
    """
    return choose_num_splits(batch, head_groups(heads), max_context, device, cap=MLA_MAX_SPLITS)


def choose_launch(programs: int, device: torch.device) -> tuple[int, int, int]:
    """The decode launch for a grid of `programs` (batch x KV heads x splits).

    A small grid (at most 4 programs per SM: splits were chosen to fill it) keeps more loads in
    flight with twice the programs of half the tile; a large one reads faster with 128-position
    tiles (0.94 against 0.92 at (256, 2048) on an H200). The CPU interpreter takes the small one.
    """
    if device.type != "cuda":
        return SMALL_GRID_LAUNCH
    return grid_launch(programs, _sm_count(device))


def grid_launch(programs: int, sms: int) -> tuple[int, int, int]:
    """`choose_launch` on a GPU of `sms` multiprocessors."""
    return LARGE_GRID_LAUNCH if programs > PROGRAMS_PER_SM * sms else SMALL_GRID_LAUNCH


@dataclass(frozen=True)
class DecodeWorkspace:
    """Split-KV scratch of decode attention, allocated once for the largest launch a caller makes.

    Split s of sequence b writes its partial output for query head h at `part[b, h, s]` and the
    log-sum-exp beside it at `lse[b, h, s]`; a merge weighs them into the output. For the fused
    merge, `tickets[b, kv_head]` counts the splits of (b, kv_head) that have finished: the one
    that finishes last merges, then sets it back to 0. So the tickets are zero between launches
    (allocated zeroed, never written otherwise), and one workspace serves every launch that fits
    it, of any batch or split count, eagerly or replayed in a CUDA graph, with no memset per call.

    Launches sharing a workspace must run one after another (one stream, as a model's layers
    do): two at once would mix their partials and tickets.
    """

    part: torch.Tensor  # [N, H, S, D] float32: each split's normalized partial output
    lse: torch.Tensor  # [N, H, S] float32: its log-sum-exp (-inf: the split saw no position)
    tickets: torch.Tensor  # [N, Hkv] int32: finished splits of (sequence, KV head); 0 between launches

    @classmethod
    def allocate(
        cls, max_batch: int, heads: int, kv_heads: int, head_dim: int, max_splits: int, device, *,
        tickets: bool = True,
    ) -> DecodeWorkspace:  # fmt: skip
        """Room for `max_batch` sequences of `heads` query heads in up to `max_splits` splits.

        `tickets=False` leaves out the fused merge's counters (a merge kernel does not use them),
        sparing their memset when a call allocates its own scratch.
        """
        part = torch.empty((max_batch, heads, max_splits, head_dim), dtype=torch.float32, device=device)
        lse = torch.empty((max_batch, heads, max_splits), dtype=torch.float32, device=device)
        counters = torch.zeros((max_batch if tickets else 0, kv_heads), dtype=torch.int32, device=device)
        return cls(part, lse, counters)

    @property
    def max_splits(self) -> int:
        return self.part.shape[2]

    @staticmethod
    def buffers(
        workspace: DecodeWorkspace | None, out: torch.Tensor, batch: int, heads: int, kv_heads: int,
        head_dim: int, splits: int, *, fused: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:  # fmt: skip
        """A split launch's (part, lse, tickets, CAP): `workspace`'s, allocated when None and checked
        against the launch; with one split, `out` stands in for all three (the kernel writes the
        output itself and never touches them) and CAP is 1."""
        if splits == 1:
            return out, out, out, 1
        if workspace is None:
            workspace = DecodeWorkspace.allocate(
                batch, heads, kv_heads, head_dim, splits, out.device, tickets=fused
            )
        workspace.check(batch, heads, kv_heads, head_dim, splits, out.device, fused=fused)
        return workspace.part, workspace.lse, workspace.tickets, workspace.max_splits

    def check(
        self, batch: int, heads: int, kv_heads: int, head_dim: int, splits: int, device, *, fused: bool
    ) -> None:
        """Raise ValueError unless a launch of this shape fits (the kernels index it unchecked)."""
        rows, room_heads, room_splits, room_dim = self.part.shape
        fits = (
            batch <= rows
            and (heads, kv_heads, head_dim) == (room_heads, self.tickets.shape[1], room_dim)
            and splits <= room_splits
            and (not fused or batch <= self.tickets.shape[0])
            and all(t.is_contiguous() for t in (self.part, self.lse, self.tickets))  # indexed by shape
            and self.part.device == torch.device(device)
        )
        if not fits:
            raise ValueError(
                f"decode workspace {tuple(self.part.shape)} (tickets {tuple(self.tickets.shape)}, "
                f"{self.part.device}) cannot hold batch {batch}, heads {heads}, kv heads {kv_heads}, "
                f"head dim {head_dim}, {splits} splits{', fused merge' if fused else ''} on {device}"
            )
