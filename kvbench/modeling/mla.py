"""DeepSeek-V2 (and V2-Lite): multi-head latent attention (MLA) and a mixture of experts.

MLA's point is the cache: per token and layer it keeps one latent `c` (kv_lora_rank values,
after `kv_a_layernorm`) and one rotated rope key (qk_rope_head_dim values) that every head
shares, instead of K and V per head (`KVArena` stores them as one `[latent + rope]` vector).
Head h's key and value are `W_uk[h] c` and `W_uv[h] c` (`kv_b_proj`'s two parts), so decode
never expands them: it folds `W_uk[h]` into the query and `W_uv[h]` into the output
("absorbed" form) and attends over the latent, as one multi-query attention of head size
latent + rope whose values are the latent::

    score(h, j) = q_nope[h] . W_uk[h] c_j + q_pe[h] . k_pe_j = [q_nope[h] W_uk[h], q_pe[h]] . [c_j, k_pe_j]
    out[h]      = W_uv[h] sum_j p(h, j) c_j

Prefill uses the same form (exact in any precision transformers' expanded form is).

What runs where: with `--attention triton` (or `auto` on a GPU) decode runs the Triton kernel
`kernels/mla_decode.py` (each cached vector read once for a group of 16 heads; CUDA graphs
capture it) and the new tokens' vectors are stored by `kernels/kv_store.py`; with `--attention
torch`, decode runs `kernels.reference.mla_decode_attention_ref`. Prefill runs the PyTorch
reference `extend_attention_ref` on every backend (no latent prefill kernel yet), so a CUDA
graph may hold MLA decode steps only. The experts of a small step on a GPU (a decode step: at
most `DENSE_DISPATCH_ROWS` tokens) run without reading the host, so CUDA graphs capture them:
densely by default, every expert over every row weighted 0 where the router did not choose it
(for decode batches the bytes are the same: a step of a few dozen rows touches nearly every
expert's weights anyway, but the compute is experts / top_k times the chosen experts'), or
grouped (`set_expert_dispatch`): each (row, choice) pair once, sorted by expert, through
`torch._grouped_mm` over the experts' weights stacked per projection.

Rotary embeddings rotate adjacent pairs (DeepSeek's layout, as transformers' `apply_rotary_emb`
does), not halves, with the YaRN scaling the published
checkpoints set (frequencies, cos/sin factor, softmax mscale: `rope.py`). The feed-forward part
is a dense SwiGLU MLP in the first `first_k_dense_replace` layers, then shared experts plus the
top-k of the routed ones (softmax router, greedy top-k, weights x routed_scaling_factor); a
large step (a prefill) dispatches each expert over the rows that chose it, on the host: correct,
not fast. Parameter names are Hugging Face's (`DeepseekV2ForCausalLM`).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from kvbench.errors import KvbenchError
from kvbench.kvspec.model import EXPERT_DISPATCHES, RopeScaling
from kvbench.modeling import ops, rope
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.decoder import DecoderForCausalLM
from kvbench.modeling.llama import LlamaDecoderLayer, LlamaMLP, RMSNorm
from kvbench.models import ModelSpec
from kvbench.parallel.layers import SINGLE, Linear, TensorParallel


def rotary_pairs(
    x: torch.Tensor, positions: torch.Tensor, theta: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """x `[T, heads, D]` rotated at `positions` `[T]`, pairs (x[2i], x[2i+1]) as complex numbers
    (DeepSeek's interleaved layout; Llama's `ops.rotary` rotates halves); YaRN's frequencies and
    attention factor where `scaling` is set."""
    freqs = ops.inv_freq(x.shape[-1], theta, x.device, scaling)  # [D/2]
    angles = positions[:, None].float() * freqs[None, :]  # [T, D/2]
    turn = torch.polar(torch.ones_like(angles), angles) * rope.attention_factor(scaling)  # [T, D/2]
    turn = turn[:, None, :]  # [T, 1, D/2]
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # [T, heads, D/2]
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)


def mla_attention(
    q: torch.Tensor, new: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata, scale: float,
    latent: int,
) -> torch.Tensor:  # fmt: skip
    """q `[T, H, latent + rope]` (absorbed), new `[T, 1, latent + rope]` -> `[T, H, latent]`.

    Stores the new tokens' latent and rope key first; keys and values are both read from the
    one cache (the values' rope part is dropped after the weighted sum). On the Triton backend
    the store and decode run the kernels (`kernels/kv_store.py`, `kernels/mla_decode.py`), which
    CUDA graphs capture; prefill runs the PyTorch reference on every backend.
    """
    triton = meta.backend == "triton"
    if q.is_cuda and torch.cuda.is_current_stream_capturing() and (meta.is_prefill or not triton):
        raise KvbenchError(  # the reference reads lengths on the host
            "--attention: MLA (DeepSeek) decodes in CUDA graphs only with the Triton attention "
            "(--attention triton or auto); run --attention torch with --no-cuda-graphs"
        )
    if triton:
        from kernels.kv_store import store_kv
    else:
        from kernels.reference import store_kv_ref as store_kv
    store_kv(new, new, cache, cache, meta.slot_mapping)
    if meta.is_prefill:
        from kernels.reference import extend_attention_ref

        out = extend_attention_ref(
            q, cache, cache, meta.cu_seqlens, meta.context_lens, scale=scale, **meta.addressing()
        )  # fmt: skip
        return out[..., :latent]
    if triton:
        from kernels.mla_decode import mla_decode_attention as decode
    else:
        from kernels.reference import mla_decode_attention_ref as decode
    splits = {"num_splits": meta.num_splits} if triton else {}
    return decode(q, cache, meta.context_lens, scale=scale, latent=latent, **splits, **meta.addressing())


class MLAttention(nn.Module):
    """DeepSeek-V2's attention of one layer (q_proj, or q_a/q_b with q_a_layernorm; the latent's
    kv_a_proj_with_mqa, kv_a_layernorm and kv_b_proj; o_proj)."""

    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        m = self.mla = spec.mla
        self.spec, self.heads = spec, spec.num_heads
        query = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            self.q_a_proj = Linear(spec.hidden, m.q_lora_rank, bias=False, **factory)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, 1e-6, **factory)  # transformers' default eps
            self.q_b_proj = Linear(m.q_lora_rank, self.heads * query, bias=False, **factory)
        else:
            self.q_proj = Linear(spec.hidden, self.heads * query, bias=False, **factory)
        compressed = m.kv_lora_rank + m.qk_rope_head_dim
        self.kv_a_proj_with_mqa = Linear(spec.hidden, compressed, bias=False, **factory)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, 1e-6, **factory)
        self.kv_b_proj = Linear(
            m.kv_lora_rank, self.heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False, **factory
        )  # fmt: skip
        self.o_proj = Linear(self.heads * m.v_head_dim, spec.hidden, bias=False, **factory)
        # transformers: qk_head_dim ** -0.5, x YaRN's mscale(factor, mscale_all_dim)^2 where set
        self.scale = query**-0.5 * rope.softmax_scale_factor(spec.rope_scaling)

    def forward(self, x, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        m, t = self.mla, x.shape[0]
        if k_cache.shape[1:] != (1, m.kv_lora_rank + m.qk_rope_head_dim):  # an arena laid out as K/V per head
            raise KvbenchError(
                f"--model {self.spec.name}: MLA needs an arena of latent + rope key slots (KVArena); "
                "this engine's arena keeps K and V per head"
            )
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if m.q_lora_rank else self.q_proj(x)
        q = q.view(t, self.heads, -1)  # [T, H, nope + rope]
        q_nope, q_pe = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)  # [T, latent]: what is cached, normalised
        s = self.spec
        q_pe = rotary_pairs(q_pe, positions, s.rope_theta, s.rope_scaling)  # [T, H, rope]
        k_pe = rotary_pairs(k_pe[:, None, :], positions, s.rope_theta, s.rope_scaling)  # [T, 1, rope]
        w = self.kv_b_proj.weight.view(self.heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
        w_uk, w_uv = w.split([m.qk_nope_head_dim, m.v_head_dim], dim=1)  # [H, nope, latent], [H, v, latent]
        q_latent = torch.einsum("thn,hnl->thl", q_nope, w_uk)  # [T, H, latent]: W_uk folded in
        new = torch.cat([latent[:, None, :], k_pe], dim=-1)  # [T, 1, latent + rope]
        o = mla_attention(torch.cat([q_latent, q_pe], dim=-1), new, k_cache, meta, self.scale, m.kv_lora_rank)
        o = torch.einsum("thl,hvl->thv", o, w_uv)  # [T, H, v]: W_uv folded in
        return self.o_proj(o.reshape(t, -1))


# at least the largest decode graph bucket (kvbench.real.decode_loop.MAX_GRAPH_BATCH; tested)
DENSE_DISPATCH_ROWS = 512
# how the routed experts of a step run: every expert over every row (weighted 0 where not chosen),
# each expert over its own rows found on the host, or one grouped matmul over rows sorted by expert
STEP_DISPATCHES = ("sparse", *EXPERT_DISPATCHES)


class MoE(nn.Module):
    """Shared experts (always on) plus the top-k routed experts of each token."""

    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        e = self.moe = spec.moe
        self.gate = Linear(spec.hidden, e.experts, bias=False, **factory)  # the router
        expert = replace(spec, ffn=e.expert_ffn)
        self.experts = nn.ModuleList(LlamaMLP(expert, **factory) for _ in range(e.experts))
        if e.shared_experts:  # one MLP as wide as all shared experts together (as the checkpoints)
            self.shared_experts = LlamaMLP(replace(spec, ffn=e.expert_ffn * e.shared_experts), **factory)
        self.small_step_dispatch = "dense"  # a GPU step of at most DENSE_DISPATCH_ROWS rows
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def stack_experts(self) -> None:
        """Lay the routed experts' weights out as two stacked tensors, each expert's parameters
        becoming views of its slice: the grouped dispatch reads one `[E, ...]` tensor per
        projection, and no weight is held twice. Called once the weights are in place (a copy
        into a parameter later still lands in the stack)."""
        gate_up = torch.stack([e.gate_up_proj.weight for e in self.experts])  # [E, 2 ffn, hidden]
        down = torch.stack([e.down_proj.weight for e in self.experts])  # [E, hidden, ffn]
        for index, e in enumerate(self.experts):
            e.gate_up_proj.weight.data = gate_up[index]
            e.down_proj.weight.data = down[index]
        self._stacked = (gate_up, down)

    def forward(self, x: torch.Tensor, *, dispatch: str | None = None) -> torch.Tensor:
        """`x` `[T, hidden]`. `dispatch` (one of `STEP_DISPATCHES`); None: a step of at most
        `DENSE_DISPATCH_ROWS` rows runs `small_step_dispatch` on a GPU (dense or grouped: neither
        reads the host, so CUDA graphs capture both), and grouped anywhere once chosen; any other
        step the sparse dispatch. All three give the same sums up to rounding."""
        scores = torch.nn.functional.linear(x.float(), self.gate.weight.float()).softmax(dim=-1)  # [T, E]
        weights, chosen = scores.topk(self.moe.top_k, dim=-1)  # [T, k] each
        weights = weights * self.moe.routed_scale
        if dispatch is None:  # grouped, once chosen, on any device (dense is for GPUs only)
            on_device = x.is_cuda or self.small_step_dispatch == "grouped"
            small = on_device and x.shape[0] <= DENSE_DISPATCH_ROWS
            dispatch = self.small_step_dispatch if small else "sparse"
        run = {"dense": self._dense, "sparse": self._sparse, "grouped": self._grouped}[dispatch]
        out = run(x, chosen, weights)
        if self.moe.shared_experts:
            out = out + self.shared_experts(x)
        return out

    def _dense(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        gates = torch.zeros(x.shape[0], self.moe.experts, dtype=weights.dtype, device=x.device)  # [T, E]
        gates.scatter_(1, chosen, weights)  # a token's weight for each expert, 0 where not chosen
        out = torch.zeros_like(x)  # [T, hidden]
        for index, expert in enumerate(self.experts):
            out += (expert(x) * gates[:, index, None]).to(x.dtype)
        return out

    def _sparse(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():  # the dispatch below reads the host
            raise KvbenchError(
                f"--cuda-graphs: a step of {x.shape[0]} tokens dispatches the experts (MoE) of MLA "
                "(DeepSeek) models on the host, which CUDA graphs cannot capture; run with --no-cuda-graphs"
            )
        out = torch.zeros_like(x)  # [T, hidden]
        for index in chosen.unique().tolist():  # one expert at a time, over the tokens that chose it
            rows, rank = (chosen == index).nonzero(as_tuple=True)
            y = self.experts[index](x[rows]) * weights[rows, rank, None]
            out.index_add_(0, rows, y.to(x.dtype))
        return out

    def _grouped(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each (row, choice) pair once, sorted by expert, through two grouped matmuls: the
        compute of the k chosen experts only, at shapes fixed by T alone (a CUDA graph's)."""
        if self._stacked is None:
            raise KvbenchError("the grouped expert dispatch needs the stacked experts (MoE.stack_experts)")
        gate_up, down = self._stacked  # [E, 2 ffn, hidden], [E, hidden, ffn]
        t, k = chosen.shape
        flat = chosen.reshape(-1)  # [T k]: row r's choice j at r k + j
        order = torch.argsort(flat, stable=True)  # [T k]: pairs grouped by expert
        per_expert = torch.zeros(self.moe.experts, dtype=torch.int32, device=x.device)
        per_expert.scatter_add_(0, flat.int(), torch.ones_like(flat, dtype=torch.int32))  # no host sync
        ends = per_expert.cumsum(0, dtype=torch.int32)  # [E]: where each expert's pairs end
        rows = x[order // k]  # [T k, hidden]
        h = torch._grouped_mm(rows, gate_up.transpose(1, 2), offs=ends)  # [T k, 2 ffn]
        g, u = h.chunk(2, dim=-1)
        y = torch._grouped_mm(ops.silu_mul(g, u), down.transpose(1, 2), offs=ends)  # [T k, hidden]
        y = y * weights.reshape(-1)[order, None].to(y.dtype)
        pairs = torch.empty_like(y)  # [T k, hidden], back in (row, choice) order
        pairs[order] = y
        return pairs.view(t, k, -1).sum(dim=1).to(x.dtype)  # [T, hidden]: a fixed order, no atomics


def stack_experts(model: nn.Module) -> None:
    """Stack the routed experts of every MoE layer of `model` (see `MoE.stack_experts`)."""
    for module in model.modules():
        if isinstance(module, MoE):
            module.stack_experts()


def set_expert_dispatch(model: nn.Module, dispatch: str) -> None:
    """How the MoE layers of `model` run a small GPU step: "dense" (the default) or "grouped"."""
    if dispatch not in EXPERT_DISPATCHES:
        raise KvbenchError(
            f"--expert-dispatch must be one of {', '.join(EXPERT_DISPATCHES)}, got {dispatch!r}"
        )
    for module in model.modules():
        if isinstance(module, MoE):
            module.small_step_dispatch = dispatch


class _Layer(LlamaDecoderLayer):
    """Llama's pre-norm layer (its forward) around MLA and a dense MLP or the experts."""

    def __init__(self, spec: ModelSpec, index: int, **factory) -> None:
        nn.Module.__init__(self)  # Llama's own attention is not built
        self.self_attn = MLAttention(spec, **factory)
        dense = spec.moe is None or index < spec.moe.dense_layers
        self.mlp = LlamaMLP(spec, **factory) if dense else MoE(spec, **factory)
        self.input_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)


class DeepseekV2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def decoder_layer(cls, spec: ModelSpec, index: int, tp: TensorParallel = SINGLE, **factory) -> nn.Module:
        if tp.size > 1:
            raise KvbenchError(f"--model {spec.name}: MLA (DeepSeek) runs on one GPU (no tensor parallelism)")
        return _Layer(spec, index, **factory)

    @classmethod
    def make_norm(cls, spec: ModelSpec, **factory) -> nn.Module:
        return RMSNorm(spec.hidden, spec.norm_eps, **factory)
