"""kvbench's weights in a Hugging Face transformers model, so the anchors run the very same model.

A preset: kvbench builds its model with `random_model(spec, dtype, device, seed)` (the weights
its own engines run), and every parameter is copied into a `LlamaForCausalLM` / `OPTForCausalLM`
built from a config derived from the `ModelSpec`. kvbench packs projections that read the same
input (`qkv_proj` = q, k, v stacked along the output rows, in both families; Llama's
`gate_up_proj` = gate, up), so a
packed matrix is split back into its parts, each part taking as many rows as the transformers
parameter of that name has:

    kvbench  model.layers.0.self_attn.qkv_proj.weight  [H*D + 2*Hkv*D, hidden]
                 rows [0, H*D)            -> model.layers.0.self_attn.q_proj.weight
                 rows [H*D, H*D + Hkv*D)  -> ...k_proj.weight
                 the rest                 -> ...v_proj.weight

Every transformers parameter must be written exactly once (tied ones count once), or the
conversion fails loudly: a silently random parameter would make the anchors' tokens wrong.

A checkpoint folder is loaded by transformers itself (`from_pretrained`, offline, no remote code).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvbench.errors import KvbenchError
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.weights import _checkpoint_names, random_model
from kvbench.models import ModelSpec

NEEDS = "external engines (hf-generate, hf-cb) need transformers >= 5.17"


def transformers_module():
    """The installed transformers (5.x: `dtype=`, `rope_parameters`), or a one-line error."""
    try:
        import transformers
    except ImportError:
        raise KvbenchError(f"{NEEDS}: pip install 'kvbench[text]'") from None
    major = transformers.__version__.split(".")[0]
    if not major.isdigit() or int(major) < 5:
        raise KvbenchError(f"{NEEDS}; found {transformers.__version__}")
    return transformers


def hf_config(spec: ModelSpec):
    """A transformers config of the same architecture as `spec`, with no EOS token (lengths come
    from the trace) and no dropout."""
    tf = transformers_module()
    if spec.family == "opt":
        return tf.OPTConfig(
            vocab_size=spec.vocab, hidden_size=spec.hidden, num_hidden_layers=spec.num_layers,
            ffn_dim=spec.ffn, num_attention_heads=spec.num_heads, max_position_embeddings=spec.max_len,
            word_embed_proj_dim=spec.hidden, do_layer_norm_before=True, activation_function="relu",
            enable_bias=True, dropout=0.0, attention_dropout=0.0, tie_word_embeddings=True,
            pad_token_id=None, bos_token_id=None, eos_token_id=None,
        )  # fmt: skip
    return tf.LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, max_position_embeddings=spec.max_len,
        rms_norm_eps=spec.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


@torch.no_grad()
def copy_into_hf(model: CausalLM, hf_model: torch.nn.Module) -> None:
    """Copy every parameter of kvbench's `model` into `hf_model`, unpacking packed projections."""
    targets = dict(hf_model.named_parameters())  # tied parameters appear once
    written: set[str] = set()
    for name, param in model.named_parameters():
        names = _checkpoint_names(name, model.packed)
        missing = [part for part in names if part not in targets]
        if missing:
            raise RuntimeError(f"transformers model has no parameter {missing[0]!r} (for kvbench's {name})")
        rows = [targets[part].shape[0] for part in names]
        if sum(rows) != param.shape[0]:
            raise RuntimeError(f"{name}: {tuple(param.shape)} does not split into {names} of {rows} rows")
        for part, piece in zip(names, param.split(rows), strict=True):
            if targets[part].shape != piece.shape:
                raise RuntimeError(
                    f"{part}: shape {tuple(targets[part].shape)}, kvbench gives {tuple(piece.shape)}"
                )
            targets[part].copy_(piece)
            written.add(part)
    unwritten = sorted(set(targets) - written)
    if unwritten:
        raise RuntimeError(
            f"kvbench's model leaves transformers parameters unset: {', '.join(unwritten[:3])}"
        )


def hf_model_from_preset(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, seed: int, attn_implementation: str
) -> torch.nn.Module:
    """transformers' model holding exactly the weights `random_model(spec, dtype, device, seed)` makes."""
    tf = transformers_module()
    ours = random_model(spec, dtype, device, seed)
    with torch.device(device):
        hf = tf.AutoModelForCausalLM.from_config(
            hf_config(spec), dtype=dtype, attn_implementation=attn_implementation
        )
    copy_into_hf(ours, hf)
    del ours
    return no_eos(hf.eval())


def hf_model_from_checkpoint(
    path: Path, dtype: torch.dtype, device: torch.device, attn_implementation: str
) -> torch.nn.Module:
    """The checkpoint as transformers loads it: local files only, no remote code."""
    tf = transformers_module()
    hf = tf.AutoModelForCausalLM.from_pretrained(
        str(path), local_files_only=True, trust_remote_code=False, dtype=dtype,
        attn_implementation=attn_implementation,
    )  # fmt: skip
    return no_eos(hf.to(device).eval())


def no_eos(hf_model: torch.nn.Module) -> torch.nn.Module:
    """Forget the model's EOS token (every request generates exactly its trace's output length) and
    a checkpoint's generation defaults (a repetition penalty would change the tokens): each engine
    passes its own sampling settings."""
    hf_model.config.eos_token_id = None
    hf_model.generation_config = transformers_module().GenerationConfig(eos_token_id=None)
    return hf_model


def load_hf_model(
    model: str, seed: int, dtype: torch.dtype, device: torch.device, attn_implementation: str
) -> torch.nn.Module:
    """`--model` (a preset or a checkpoint folder) as a transformers model with
    `attn_implementation`; transformers' refusals (a flash kernel not installed, say) become one line."""
    from kvbench.config import resolve_model

    spec = resolve_model(model)
    try:
        if Path(model).is_dir():
            return hf_model_from_checkpoint(Path(model), dtype, device, attn_implementation)
        return hf_model_from_preset(spec, dtype, device, seed, attn_implementation)
    except (ImportError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise KvbenchError(
            f"--model {model} with --hf-attn {attn_implementation}: transformers cannot load it: {first}"
        ) from None
