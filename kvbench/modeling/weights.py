"""Building a model: a preset with seeded random weights, or a local Hugging Face checkpoint.

Random weights are created directly on the target device (modules built on the `meta` device,
then materialised there and initialised with a device generator), so a 13B model never makes
a CPU round trip. Checkpoints are read offline: `config.json` plus `*.safetensors` (or
`pytorch_model*.bin` with `weights_only=True`); remote code is never run.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch

from kvbench.errors import KvbenchError
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.gemma import GemmaForCausalLM
from kvbench.modeling.hf_config import deepseek_decoding_keys, read_checkpoint_spec
from kvbench.modeling.llama import LlamaForCausalLM
from kvbench.modeling.mla import DeepseekV2ForCausalLM, stack_experts
from kvbench.modeling.opt import OPTForCausalLM
from kvbench.modeling.qwen import MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from kvbench.models import ModelSpec
from kvbench.parallel.layers import SINGLE, TensorParallel

FAMILIES: dict[str, type[CausalLM]] = {
    "opt": OPTForCausalLM, "llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM,
    "mistral": MistralForCausalLM, "gemma2": GemmaForCausalLM, "gemma3": GemmaForCausalLM,
    "deepseek": DeepseekV2ForCausalLM,
}  # fmt: skip


def empty_model(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, tp: TensorParallel = SINGLE
) -> CausalLM:
    """The model's modules on `device` with uninitialised weights (a rank's shard under `tp`)."""
    if not spec.decoded:  # every real run builds its model here: refuse shapes kvbench does not compute
        windowed = ", ".join(family for family in FAMILIES if family not in ("opt", "llama", "deepseek"))
        raise KvbenchError(
            f"--model {spec.name}: kvbench decodes OPT and Llama (full attention) and {windowed} "
            f"(sliding windows included) and DeepSeek-V2 (MLA, experts); {spec.family} "
            f"({', '.join(sorted({g.kind for g in spec.groups}))} layers) is sized and simulated "
            "(kvbench simulate), not run"
        )
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
    stack_experts(model)  # MoE layers: their experts' weights as one tensor per projection
    return model


@torch.no_grad()
def load_checkpoint(path: Path, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """The checkpoint in `path`, cast to `dtype` on `device`; every parameter must be present.

    Each tensor is checked against the parameter it fills (every part of a packed projection
    on its own: parts of wrong sizes could still add up to the packed shape) and errors name
    the weights file it came from.
    """
    spec = read_checkpoint_spec(path)
    if spec.family == "deepseek" and spec.decoded:
        deepseek_decoding_keys(path, spec)
    tensors, files = _read_tensors(path)
    held = sum(tensor.numel() for tensor in tensors.values())
    if held < spec.num_params - spec.vocab * spec.hidden:  # the LM head may be tied (not stored)
        raise KvbenchError(  # before allocating a model a mistyped size may make enormous
            f"--model {path}: config.json describes {spec.num_params:,} parameters, "
            f"the weights files hold {held:,}"
        )
    model = empty_model(spec, dtype, device)
    for name, param in model.named_parameters():
        tied = spec.family == "opt" or spec.tied_embeddings
        if name == "lm_head.weight" and name not in tensors and tied:
            continue  # tied to the embedding
        names = _checkpoint_names(name, model.packed)
        packed = len(names) > 1  # rows of each part: the packed module's sections
        sizes = model.get_submodule(name.rpartition(".")[0]).sections if packed else (param.shape[0],)
        parts = []
        for part, size in zip(names, sizes, strict=True):
            key = part if part in tensors else part.removeprefix("model.")  # OPT files omit "model."
            tensor = tensors.get(key)
            if tensor is None:
                raise KvbenchError(f"--model {path}: the weights lack {part!r}")
            want = (size, *param.shape[1:])
            if tuple(tensor.shape) != want or not tensor.is_floating_point():
                raise KvbenchError(
                    f"--model {path}: {files[key].name}: {key} is {tensor.dtype} of shape "
                    f"{tuple(tensor.shape)}, expected floating point of shape {want} (from config.json)"
                )
            parts.append(tensor)
        param.copy_(parts[0] if len(parts) == 1 else torch.cat(parts))
    if spec.family != "opt" and "lm_head.weight" not in tensors:
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)  # tie_word_embeddings
    stack_experts(model)
    return model


def _checkpoint_names(name: str, packed: dict[str, tuple[str, ...]]) -> list[str]:
    """Checkpoint tensors that make up parameter `name` (several for a packed projection)."""
    module, _, leaf = name.rpartition(".")  # "model.layers.0.self_attn.qkv_proj", "weight"
    prefix, _, last = module.rpartition(".")
    if last not in packed:
        return [name]
    return [f"{prefix}.{part}.{leaf}" for part in packed[last]]


def _read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Every tensor of the folder's weights files, and the file each came from (for errors).

    `.bin` files are read with `weights_only=True`, which refuses pickled code; that refusal,
    like a truncated or corrupt file, is the user's file at fault, so it becomes one line
    naming the file rather than a traceback.
    """
    shards = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not shards:
        raise KvbenchError(f"--model {path}: no *.safetensors or pytorch_model*.bin weights in the folder")
    tensors: dict[str, torch.Tensor] = {}
    files: dict[str, Path] = {}
    for shard in shards:
        loaded = _read_shard(shard)
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
        ):
            raise KvbenchError(f"--model {path}: {shard.name} does not hold a dict of named tensors")
        tensors.update(loaded)
        files.update(dict.fromkeys(loaded, shard))
    return tensors, files


def _read_shard(shard: Path) -> object:
    try:
        if shard.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(shard))
        with warnings.catch_warnings():  # torch warns (many lines) about the pickle it then refuses
            warnings.simplefilter("ignore")
            return torch.load(shard, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as error:  # the parsers' many errors for a bad file (pickle, zip, header, EOF)
        first = (str(error).strip().splitlines() or [""])[0].split(". ")[0][:160]
        why = "refused: not plain tensors" if isinstance(error, pickle.UnpicklingError) else "unreadable"
        raise KvbenchError(
            f"--model {shard.parent}: {shard.name} is {why} ({type(error).__name__}: {first})"
        ) from None
