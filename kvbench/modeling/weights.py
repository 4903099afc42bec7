"""Building a model: a preset with seeded random weights, or a local Hugging Face checkpoint.

Random weights are created directly on the target device (modules built on the `meta` device,
then materialised there and initialised with a device generator), so a 13B model never makes
a CPU round trip. Checkpoints are read offline: `config.json` plus `*.safetensors` (or
`pytorch_model*.bin` with `weights_only=True`); remote code is never run.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kvbench.errors import KvbenchError
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.llama import LlamaForCausalLM
from kvbench.modeling.opt import OPTForCausalLM
from kvbench.models import ModelSpec
from kvbench.parallel.layers import SINGLE, TensorParallel

FAMILIES: dict[str, type[CausalLM]] = {"opt": OPTForCausalLM, "llama": LlamaForCausalLM}
HF_MODEL_TYPES = {"opt": "opt", "llama": "llama", "mistral": "llama"}


def empty_model(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, tp: TensorParallel = SINGLE
) -> CausalLM:
    """The model's modules on `device` with uninitialised weights (a rank's shard under `tp`)."""
    model = FAMILIES[spec.family](spec, tp=tp, device="meta", dtype=dtype).to_empty(device=device)
    model.tie_weights()
    return model.eval()


def init_parameter(name: str, param: torch.Tensor, generator: torch.Generator) -> None:
    """A preset's weight `name`: biases 0, norm scales 1, else N(0, 0.02) drawn from `generator`
    (parameters drawn in `named_parameters` order: tensor-parallel shards replay the same draws)."""
    if name.endswith("bias"):
        param.zero_()
    elif "norm" in name:
        param.fill_(1.0)
    else:
        param.normal_(0.0, 0.02, generator=generator)


@torch.no_grad()
def random_model(spec: ModelSpec, dtype: torch.dtype, device: torch.device, seed: int = 0) -> CausalLM:
    """Seeded N(0, 0.02) weights (norm scales 1, biases 0), generated on `device`."""
    model = empty_model(spec, dtype, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        init_parameter(name, param, generator)
    return model


def spec_from_hf_config(config: dict, name: str) -> ModelSpec:
    """A `ModelSpec` from a Hugging Face `config.json` (OPT, Llama, Mistral)."""
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        supported = ", ".join(HF_MODEL_TYPES)
        raise KvbenchError(f"--model {name}: unsupported architecture {model_type!r} (one of: {supported})")
    family = HF_MODEL_TYPES[model_type]
    try:
        if family == "opt":
            if config.get("word_embed_proj_dim", config["hidden_size"]) != config["hidden_size"]:
                raise KvbenchError(
                    f"--model {name}: OPT with a projected embedding (opt-350m) is not supported"
                )
            if not config.get("do_layer_norm_before", True):
                raise KvbenchError(f"--model {name}: post-LayerNorm OPT is not supported")
            heads = config["num_attention_heads"]
            return ModelSpec(
                name, "opt", config["num_hidden_layers"], config["hidden_size"], heads, heads,
                config["ffn_dim"], config["vocab_size"], config["max_position_embeddings"],
            )  # fmt: skip
        scaling = config.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise KvbenchError(f"--model {name}: rope scaling {scaling!r} is not supported yet")
        heads = config["num_attention_heads"]
        rope = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return ModelSpec(
            name, "llama", config["num_hidden_layers"], config["hidden_size"], heads,
            config.get("num_key_value_heads") or heads, config["intermediate_size"], config["vocab_size"],
            config["max_position_embeddings"], norm_eps=config.get("rms_norm_eps", 1e-6), rope_theta=rope,
        )  # fmt: skip
    except KeyError as missing:
        raise KvbenchError(f"--model {name}: config.json lacks {missing.args[0]!r}") from None


def read_checkpoint_spec(path: Path) -> ModelSpec:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise KvbenchError(f"--model {path}: no config.json in the checkpoint folder")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise KvbenchError(f"--model {path}: config.json is not valid JSON (line {error.lineno})") from None
    return spec_from_hf_config(config, str(path))


@torch.no_grad()
def load_checkpoint(path: Path, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """The checkpoint in `path`, cast to `dtype` on `device`; every parameter must be present."""
    spec = read_checkpoint_spec(path)
    model = empty_model(spec, dtype, device)
    tensors = _read_tensors(path)
    for name, param in model.named_parameters():
        if name == "lm_head.weight" and name not in tensors and spec.family == "opt":
            continue  # tied to the embedding
        parts = []
        for part in _checkpoint_names(name, model.packed):
            tensor = tensors.get(part, tensors.get(part.removeprefix("model.")))  # OPT files omit "model."
            if tensor is None:
                raise KvbenchError(f"--model {path}: the weights lack {part!r}")
            parts.append(tensor)
        tensor = parts[0] if len(parts) == 1 else torch.cat(parts)
        if tuple(tensor.shape) != tuple(param.shape):
            raise KvbenchError(
                f"--model {path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        param.copy_(tensor)
    if spec.family == "llama" and "lm_head.weight" not in tensors:
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)  # tie_word_embeddings
    return model


def _checkpoint_names(name: str, packed: dict[str, tuple[str, ...]]) -> list[str]:
    """Checkpoint tensors that make up parameter `name` (several for a packed projection)."""
    module, _, leaf = name.rpartition(".")  # "model.layers.0.self_attn.qkv_proj", "weight"
    prefix, _, last = module.rpartition(".")
    if last not in packed:
        return [name]
    return [f"{prefix}.{part}.{leaf}" for part in packed[last]]


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(str(shard)))
        return out
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise KvbenchError(f"--model {path}: no *.safetensors or pytorch_model*.bin weights in the folder")
    out = {}
    for shard in bins:
        out.update(torch.load(shard, map_location="cpu", weights_only=True))
    return out
