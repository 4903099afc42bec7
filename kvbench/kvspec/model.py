"""`ModelSpec`: a model's architecture, as far as sizing its KV cache and its weights needs it.

Parameter counts are computed from the architecture (not typed in), so a preset is one line of
public config values and the derived numbers can be checked against the model cards (OPT-13B:
12.85 B parameters, 819,200 KV bytes per token in fp16).

`kv_bytes_per_token` is one slot of kvbench's arena: K/V of one token in *every* layer. For a
full-attention model that is exactly what a token costs; for a model with sliding-window layers
it is what an allocator pays that treats those layers as full (every engine kvbench has today),
and `kv_bytes_held(n)` is what an ideal hybrid allocator keeps of an n-token sequence. The
per-layer view (`layers`, `groups`) says where the bytes are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvbench.kvspec.layers import FullAttention, KVGroup, LatentAttention, LayerKV, SlidingWindow, kv_groups

Family = Literal["opt", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "deepseek"]
DECODED_FAMILIES = ("opt", "llama")  # what kvbench/modeling/ computes with full attention only
# families kvbench/modeling/ computes with their sliding windows and head sizes (not MLA, not MoE)
WINDOWED_FAMILIES = ("qwen2", "qwen3", "mistral", "gemma2", "gemma3")


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V2/V3): the cache holds `kv_lora_rank` +
    `qk_rope_head_dim` values per token; the other widths size the projections."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: queries projected directly (V2-Lite), else through a low-rank latent


# how a decode step of a MoE model runs the routed experts on a GPU (`--expert-dispatch`):
# every expert over every row weighted by the router, or each (row, choice) pair once, grouped
EXPERT_DISPATCHES = ("dense", "grouped")


@dataclass(frozen=True)
class MoeShape:
    """Mixture-of-experts feed-forward layers (DeepSeek): all experts count as parameters."""

    experts: int  # routed experts per MoE layer (n_routed_experts)
    shared_experts: int  # always-active experts (n_shared_experts)
    expert_ffn: int  # moe_intermediate_size
    dense_layers: int  # the first layers keep a dense MLP of `ffn` (first_k_dense_replace)
    top_k: int = 0  # routed experts per token (num_experts_per_tok); 0: unknown, not decoded
    routed_scale: float = 1.0  # routed experts' weights x this (routed_scaling_factor)


@dataclass(frozen=True)
class RopeScaling:
    """A long-context checkpoint's rotary scaling (config.json's rope_scaling or rope_parameters):
    which rotary frequencies are stretched, and by how much. It changes every attention layer's
    arithmetic, never what a token stores; `kvbench/modeling/rope.py` computes with it."""

    kind: Literal["yarn", "llama3"]
    factor: float  # new context / pretraining context
    original_max_len: int  # the pretraining context (original_max_position_embeddings)
    beta_fast: float = 32.0  # yarn: dimensions turning more often than this over it keep their frequency
    beta_slow: float = 1.0  # yarn: fewer turns than this: frequency / factor; a linear ramp between
    mscale: float = 0.0  # yarn (DeepSeek): cos/sin x mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    mscale_all_dim: float = 0.0  # DeepSeek: softmax scale x mscale(factor, this)^2; 0: neither given
    attention_factor: float = 0.0  # yarn: cos/sin x this as given; 0: derived (0.1 ln factor + 1)
    truncate: bool = True  # yarn: the ramp's ends rounded out to whole dimensions
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_max_len / this: frequency / factor
    high_freq_factor: float = 4.0  # llama3: below original_max_len / this: kept; smoothed between


@dataclass(frozen=True)
class ModelSpec:
    """The config.json values that size a model's weights and KV cache. Fields after `rope_theta`
    default to what OPT and Llama have (no window, K and V per head), so those presets stay one
    positional line; `window_layers` and `mla` decide each layer's kind (`layers`)."""

    name: str
    family: Family
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int  # < num_heads for grouped-query attention (Llama-3)
    ffn: int  # feed-forward width (OPT: 4 x hidden; Llama: SwiGLU intermediate size)
    vocab: int
    max_len: int  # maximum sequence length (prompt + output); OPT's learned positions stop at 2048
    dtype_bytes: int = 2  # fp16/bf16 weights and KV
    norm_eps: float = 1e-5  # LayerNorm (OPT) / RMSNorm (Llama) epsilon
    rope_theta: float = 10000.0  # Llama rotary base (Gemma 3: its global layers')
    head_size: int = 0  # config.json's head_dim where it is not hidden / heads (Qwen3, Gemma); 0: it is
    window: int = 0  # sliding-window layers attend to the last `window` tokens
    window_layers: tuple[int, ...] = ()  # indices of the sliding-window layers (the rest: full)
    local_rope_theta: float | None = None  # Gemma 3's sliding layers' rotary base (rope_local_base_freq)
    tied_embeddings: bool = False  # the LM head is the token embedding (OPT always; Gemma; Qwen3-0.6B)
    query_scale: float = 0.0  # Gemma's query_pre_attn_scalar: scores scaled by its -1/2 power; 0: head_dim's
    attn_softcap: float = 0.0  # Gemma 2: attention scores become cap * tanh(score / cap); 0: none
    final_softcap: float = 0.0  # Gemma 2: the same on the final logits; 0: none
    mla: MlaShape | None = None  # latent KV instead of K and V per head
    moe: MoeShape | None = None
    rope_scaling: RopeScaling | None = None  # None: plain rotary frequencies (every preset)

    def __post_init__(self) -> None:
        if self.window_layers and (
            self.window < 1
            or list(self.window_layers) != sorted(set(self.window_layers))
            or not 0 <= self.window_layers[0] <= self.window_layers[-1] < self.num_layers
        ):
            raise ValueError(f"{self.name}: window layers {self.window_layers} of window {self.window}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.num_heads

    # --- the KV cache, per layer -------------------------------------------------------------
    @property
    def full_layer(self) -> FullAttention | LatentAttention:
        """The spec of every layer that keeps all tokens."""
        if self.mla is not None:
            return LatentAttention(self.mla.kv_lora_rank, self.mla.qk_rope_head_dim, self.dtype_bytes)
        return FullAttention(self.num_kv_heads, self.head_dim, self.dtype_bytes)

    @property
    def window_layer(self) -> SlidingWindow:
        return SlidingWindow(self.num_kv_heads, self.head_dim, self.window, self.dtype_bytes)

    @property
    def layers(self) -> tuple[LayerKV, ...]:
        """What each layer keeps per token, in order (OPT and Llama: all full attention)."""
        windowed = set(self.window_layers)
        full, window = self.full_layer, self.window_layer
        return tuple(window if index in windowed else full for index in range(self.num_layers))

    @property
    def groups(self) -> tuple[KVGroup, ...]:
        """The layers grouped by kind and shape: the pools of a hybrid allocator."""
        return kv_groups(self.layers)

    @property
    def full_bytes_per_token(self) -> int:
        """One token in every layer that keeps all tokens (full attention or MLA)."""
        return (self.num_layers - len(self.window_layers)) * self.full_layer.bytes_per_token

    @property
    def window_bytes_per_token(self) -> int:
        """One token in every sliding-window layer (0 without any)."""
        return len(self.window_layers) * self.window_layer.bytes_per_token

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer: one slot of the KV arena."""
        return self.full_bytes_per_token + self.window_bytes_per_token

    def kv_bytes_held(self, n: int) -> int:
        """What an ideal hybrid allocator keeps of an n-token sequence: full layers x n + window
        layers x min(n, window)."""
        return self.full_bytes_per_token * n + self.window_bytes_per_token * min(n, self.window)

    @property
    def decoded(self) -> bool:
        """Whether kvbench's own model code computes this architecture (else: sized and simulated)."""
        if self.family in WINDOWED_FAMILIES:
            return self.mla is None and self.moe is None
        if self.family == "deepseek":  # MLA, and experts where the router's top-k is known
            routed = self.moe is None or self.moe.top_k > 0
            return self.mla is not None and not self.window_layers and routed
        return (
            self.family in DECODED_FAMILIES and not self.window_layers and self.mla is None
            and self.head_dim * self.num_heads == self.hidden
        )  # fmt: skip

    # --- parameters ---------------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        """Token embeddings, an untied LM head and OPT's learned positions: what the model cards'
        "non-embedding" counts leave out."""
        if self.family == "opt":  # tied LM head; positions offset by 2
            return self.vocab * self.hidden + (self.max_len + 2) * self.hidden
        return (1 if self.tied_embeddings else 2) * self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        layers = self.num_layers * self._layer_params + self._moe_params
        return layers + self.embedding_params + self._final_norm

    @property
    def active_params(self) -> int:
        """`num_params` less the routed experts a token's forward never runs: a MoE layer runs its
        router's top-k beside the shared experts, so the others cost the token no FLOPs.
        DeepSeek-V2-Lite: 2.66 B of 15.7 B (its model card: 2.4 B activated, without the 0.21 B
        input embedding, a lookup, which `num_params` counts for every model). Dense models, and
        MoE shapes whose top-k is unknown (0), use them all."""
        if self.moe is None or not self.moe.top_k:
            return self.num_params
        e = self.moe
        return self.num_params - self.routed_expert_params // e.experts * (e.experts - e.top_k)

    @property
    def routed_expert_params(self) -> int:
        """The routed experts of every MoE layer (not the shared ones, not the router): weights a
        token runs only where its router picks them, and a step reads only where one of its
        tokens does (`CostModel.roofline`). 0 for a dense model."""
        if self.moe is None:
            return 0
        e = self.moe
        return (self.num_layers - e.dense_layers) * e.experts * 3 * self.hidden * e.expert_ffn

    @property
    def expert_pick(self) -> float:
        """The share of a MoE layer's routed experts one token runs (top-k / experts); 0 for a dense
        model and for a MoE shape whose top-k is unknown."""
        return self.moe.top_k / self.moe.experts if self.moe is not None else 0.0

    @property
    def _final_norm(self) -> int:
        return 2 * self.hidden if self.family == "opt" else self.hidden  # LayerNorm: scale and bias

    @property
    def _layer_params(self) -> int:
        """One layer with a dense feed-forward part (MoE layers: `_moe_params` corrects them)."""
        h, kv = self.hidden, self.num_kv_heads * self.head_dim
        if self.family == "opt":  # biases everywhere, two LayerNorms
            attn = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h
            return attn + 2 * h * self.ffn + self.ffn + h + 4 * h
        return self._attention_params + 3 * h * self.ffn + (4 if self.family.startswith("gemma") else 2) * h

    @property
    def _attention_params(self) -> int:
        h, q, kv = self.hidden, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.mla is not None:
            m, heads = self.mla, self.num_heads
            query = m.qk_nope_head_dim + m.qk_rope_head_dim
            q_down = h * m.q_lora_rank + m.q_lora_rank  # the query latent and its norm (0 without)
            q_proj = q_down + heads * query * (m.q_lora_rank or h)
            kv_proj = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # down-projection, its norm
            kv_up = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
            return q_proj + kv_proj + kv_up + heads * m.v_head_dim * h
        params = 2 * h * q + 2 * h * kv  # q, o; k, v
        if self.family == "qwen2":
            params += q + 2 * kv  # q, k, v biases
        if self.family in ("qwen3", "gemma3"):
            params += 2 * self.head_dim  # q and k RMSNorm
        return params

    @property
    def _moe_params(self) -> int:
        """MoE layers' experts and router instead of their dense MLP (router biases not counted)."""
        if self.moe is None:
            return 0
        e, h = self.moe, self.hidden
        per_layer = (e.experts + e.shared_experts) * 3 * h * e.expert_ffn + h * e.experts - 3 * h * self.ffn
        return (self.num_layers - e.dense_layers) * per_layer

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes
