"""Content keys of a request's full prompt blocks: what the paged prefix cache matches on.

Two blocks may share one arena block only if they hold the same K/V: the same tokens at the
same positions after the same earlier tokens. So a key chains from the start of the sequence,
`key_j = hash((key_{j-1}, content_j))` (vLLM's block hashes), and equal keys mean equal
prefixes up to the end of the block. Only full blocks get a key: a partly filled block is
still being written.

What `content_j` is depends on what the trace knows about the prompt, best first:

1. `prompt_ids`: the block's token ids.
2. `block_hashes` with the trace's `hash_block_size` (Mooncake: 512-token blocks): the hash
   ids of the hash blocks that the block's tokens lie in. Hash ids identify their block's
   content (a partial last hash block has its own id), so equal chains up to block j mean
   equal tokens up to its end.
3. `prefix_group` with `prefix_len`: a block entirely inside the first `prefix_len` tokens
   is the group's own block j (every request of the group starts with the same tokens); the
   request's own tokens follow. A chat turn whose history was not truncated is its
   conversation's stream from the start (`workloads.sharing.multi_turn`), so its blocks are
   the ones earlier turns computed at the same positions.
4. Otherwise the request's own tokens, identified by its id: no other request matches them,
   but a request re-admitted after a recompute preemption finds its own blocks again (and
   parallel samples of one request, sharing its id, share its prompt).

Python's `hash` of a tuple of ints is the same in every process (string hashes are salted,
so a group name is first turned into an int, `group_number`); keys are 64-bit, so among ten
million blocks the odds of any collision are about 3e-6.
"""

from __future__ import annotations

from kvbench.requests import Request, group_number

_ROOT = 0x6B7662656E6368  # the key "before" block 0
# every content is (kind, payload): token ids, hash ids, a group's number or a request id never
# meet even where their numbers agree (a 2-token block (2, 7) is not request 7's own content)
_IDS, _HASHES, _GROUP, _OWN = 0, 1, 2, 3


def block_keys(request: Request, block_size: int, hash_block_size: int | None = None) -> tuple[int, ...]:
    """Keys of the request's `prompt_len // block_size` full prompt blocks, chained from block 0."""
    count = request.prompt_len // block_size
    ids = request.prompt_ids
    if ids is not None:
        return _chain((_IDS, tuple(ids[j * block_size : (j + 1) * block_size])) for j in range(count))
    hashes = request.block_hashes
    if hashes is not None and hash_block_size:
        bs, size = block_size, hash_block_size
        known = min(count, len(hashes) * size // bs)  # blocks the hashes cover
        # block j (tokens [j * bs, (j + 1) * bs)) lies in hash blocks j * bs // size .. its last token // size
        spans = (
            (_HASHES, tuple(hashes[j * bs // size : ((j + 1) * bs - 1) // size + 1])) for j in range(known)
        )
        return _chain(spans, _own(request, count - known))
    if request.prefix_group is not None:
        shared = min(request.prefix_len, request.prompt_len) // block_size
        group = (_GROUP, group_number(request.prefix_group))
        return _chain([group] * shared, _own(request, count - shared))
    return _chain((), _own(request, count))


def _own(request: Request, count: int) -> list[tuple[int, int]]:
    return [(_OWN, request.request_id)] * count


def _chain(*parts) -> tuple[int, ...]:
    keys = []
    key = _ROOT
    for part in parts:
        for content in part:
            key = hash((key, content))
            keys.append(key)
    return tuple(keys)
