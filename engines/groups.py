"""Sequence groups after a step: fork parallel samples once, fork and prune beams every step.

A request with several outputs prefills its prompt once, through its leader. At the end of
that step the group branches (`branch`):

- parallel sampling: the leader's last logits give one token per sample (seeded per
  sample); members 1..n-1 are forked from the leader and run on as independent sequences;
- beam search: the prompt's top-k tokens start k beams; after every later step the k best
  continuations over all beams (`engines.beam`) are kept: beams nobody continues are freed
  and re-forked from the beams that are continued more than once.

Forks go through the allocator, so each engine does what its real counterpart does: paged
shares every block (and copies the last one on write), contiguous copies the parent's K/V
into the child's own extent (the copies come back here, to run before the next step).
A real runner supplies each branching row's candidates (`branches`); a simulation has none,
and beams then draw seeded synthetic candidates.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq

import numpy as np

from engines.allocator import KVAllocator, SlotCopy
from engines.beam import SyntheticScores, assign_slots, beam_step
from kvbench.sequence import SeqGroup, SeqStatus, Sequence, group_width

# per branching row: (token ids, log-probabilities) best first for beams, (one token per sample,
# None) for a parallel-sampling leader's prefill
Branches = Mapping[Sequence, tuple[Seq[int], Seq[float] | None]]


def groups_in(seqs: Seq[Sequence]) -> list[SeqGroup]:
    """The groups with a member among `seqs`, in order of first appearance."""
    return list(dict.fromkeys(seq.group for seq in seqs if seq.group is not None))


def admission_unit(seq: Sequence) -> list[Sequence]:
    """What admitting the head of the queue takes in: a preempted beam group whole, else `seq`."""
    group = seq.group
    return list(group.members) if group is not None and group.beam and group.forked else [seq]


def seats_taken(seq: Sequence) -> int:
    """Running sequences admitting `seq` leads to: every output of a group not yet forked."""
    group = seq.group
    if group is None or (group.forked and not group.beam):
        return 1
    return group_width(seq.request)


def unit_start(running: list[Sequence], last: int) -> int:
    """Index of the first member of the unit `running[last]` belongs to (its beam group, or itself)."""
    group = running[last].group
    if group is None or not group.beam:
        return last
    start = last
    while start > 0 and running[start - 1].group is group:
        start -= 1
    return start


def candidates_per_beam(group: SeqGroup) -> int:
    """Candidates each beam offers: 2k, as vLLM and transformers take (k suffice without EOS)."""
    return 2 * group.width


def branch(
    group: SeqGroup, alloc: KVAllocator, branches: Branches | None
) -> tuple[list[Sequence], list[SlotCopy]]:
    """After a step `group` ran in: the members that joined the engine, and K/V copies to make."""
    if group.beam:
        return _beam(group, alloc, branches)
    if group.forked:
        return [], []  # samples run alone once forked
    return _samples(group, alloc, branches)


def _samples(group: SeqGroup, alloc: KVAllocator, branches: Branches | None) -> tuple[list, list]:
    leader = group.leader
    tokens = branches[leader][0] if branches is not None else None
    group.forked = True
    joined: list[Sequence] = []
    copies: list[SlotCopy] = []
    for child in group.members[1:]:
        child.copy_progress(leader)
        if tokens is not None:
            child.output_ids[-1] = int(tokens[child.sample])
        if leader.status is not SeqStatus.FINISHED:  # a one-token output needs no K/V of its own
            copies += alloc.fork(leader, child) or []  # (a subclass may return None for no copies)
            joined.append(child)
    return joined, copies


def _beam(group: SeqGroup, alloc: KVAllocator, branches: Branches | None) -> tuple[list, list]:
    members, width = group.members, group.width
    live = members if group.forked else members[:1]  # before the fork only the leader has run
    count = candidates_per_beam(group)
    if branches is None:
        if group.synthetic is None:
            group.synthetic = SyntheticScores(members[0].request.request_id, width, count)
        tokens, logprobs = group.synthetic.next(len(live))
    else:
        tokens = np.array([branches[beam][0] for beam in live])  # (b, c)
        logprobs = np.array([branches[beam][1] for beam in live])  # (b, c)
    choices = beam_step([beam.score for beam in live], tokens, logprobs, width)
    slots, unchosen = assign_slots([choice.parent for choice in choices], width)
    # this step's token of every live beam is a placeholder: the choices replace it
    old_ids = [beam.output_ids[:-1] for beam in live] if branches is not None else None
    joined: list[Sequence] = []
    copies: list[SlotCopy] = []
    finishing = members[0].status is SeqStatus.FINISHED
    if not finishing:  # the last step's beams only need their tokens: their K/V is freed next
        if group.forked:
            for slot in unchosen:
                alloc.free(members[slot])
        for choice, slot in zip(choices, slots, strict=True):
            if slot != choice.parent:
                copies += alloc.fork(members[choice.parent], members[slot]) or []
                if not group.forked:
                    joined.append(members[slot])
    for choice, slot in zip(choices, slots, strict=True):
        beam = members[slot]
        if slot != choice.parent:
            beam.copy_progress(members[choice.parent])
        beam.score = choice.score
        if old_ids is not None:
            beam.output_ids = [*old_ids[choice.parent], choice.token]
    group.forked = True
    if finishing:
        _best_first(group)
    return joined, copies


def _best_first(group: SeqGroup) -> None:
    """Reorder the finished beams' outputs so that member 0 (the request's output) is the best."""
    ranked = sorted(group.members, key=lambda beam: -beam.score)  # stable: ties keep slot order
    outputs = [(beam.score, beam.output_ids) for beam in ranked]
    for beam, (score, ids) in zip(group.members, outputs, strict=True):
        beam.score, beam.output_ids = score, ids
