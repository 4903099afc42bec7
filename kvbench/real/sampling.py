"""What a real step's logits offer a sequence group (`engines.groups.Branches`).

- A beam row: its top candidates by log-probability (log-softmax of the row's logits),
  2k of them for a group of k beams; the beam step keeps the k best over all beams.
- A parallel-sampling leader's prompt: one first token per sample, each drawn with the
  sample's own key (`Sequence.sample_key`), so sample s of a request is what that request
  alone draws under seed + s, whatever it is batched with, in every engine.

Every other row samples as usual; rows of groups that do not branch now get nothing.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from engines.groups import Branches, candidates_per_beam
from kvbench.modeling.sampling import sample
from kvbench.sequence import SEED_STRIDE, Sequence


def wants_logits(seqs: Seq[Sequence]) -> bool:
    """Whether a step of `seqs` must hand its logits to a beam step (not just sample)."""
    return any(seq.group is not None and seq.group.beam for seq in seqs)


def branches_of(
    seqs: Seq[Sequence], logits: torch.Tensor, positions: torch.Tensor, temperature: float, seed: int
) -> Branches:
    """logits `[B, V]` of the rows' next tokens, positions `[B]` of their inputs -> each branching
    row's offer (beams: candidate ids and log-probabilities, best first; a sampling leader before
    its fork: every sample's first token)."""
    out: dict[Sequence, tuple[list[int], list[float] | None]] = {}
    beams = [row for row, seq in enumerate(seqs) if seq.group is not None and seq.group.beam]
    if beams:
        keeps = [candidates_per_beam(seqs[row].group) for row in beams]
        count = min(max(keeps), logits.shape[1])
        rows = logits if len(beams) == len(seqs) else logits[beams]  # a beam step: every row
        logprobs = torch.log_softmax(rows.float(), dim=-1)  # [R, V]
        top = torch.topk(logprobs, count, dim=-1)  # [R, c] sorted, best first
        values, indices = top.values.double().tolist(), top.indices.tolist()
        for row, keep, ids, scores in zip(beams, keeps, indices, values, strict=True):
            out[seqs[row]] = (ids, scores) if keep >= count else (ids[:keep], scores[:keep])
    for row, seq in enumerate(seqs):
        group = seq.group
        if group is None or group.beam or group.forked:
            continue
        width = group.width
        keys = seq.request.request_id + SEED_STRIDE * torch.arange(width, device=logits.device)  # [n]
        first = sample(logits[row].expand(width, -1), temperature, seed, keys, positions[row].expand(width))
        out[seq] = (first.tolist(), None)
    return out
