"""A rank's shard of the model, cut from the same full weights a single process would use.

Every rank walks the full model's parameters in order and keeps its slice of each, so the
shards together are exactly the single-process model:

- seeded presets: each full tensor is drawn on this rank's device from the same generator,
  in the same order and with the same rule as `random_model` (`init_parameter`), then cut;
  only one full tensor exists at a time (OPT-175B's largest, fc1, is 1.2 GB in fp16), so a
  model too big for one GPU is never materialised whole;
- checkpoints: the full model is read on the host (every rank reads it: fine up to a few
  tens of GB of host memory per rank; lazy per-slice reads are not done yet) and cut.

How a tensor is cut depends only on the layer that holds it (`shard_of`):

    ColumnParallelLinear  weight [out, in], bias [out]: rank r's rows of every packed part
                          (q | k | v: its q heads, its KV heads; gate | up: its columns)
    RowParallelLinear     weight [out, in]: rank r's input columns; bias: whole (added once)
    anything else         whole: embeddings, positions, norms, the LM head (replicated)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.weights import empty_model, init_parameter, load_checkpoint
from kvbench.models import ModelSpec
from kvbench.parallel.layers import ColumnParallelLinear, RowParallelLinear, TensorParallel


def shard_of(module: nn.Module, leaf: str, full: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Rank `tp.rank`'s part of `full`, the full model's parameter `leaf` of `module`."""
    if isinstance(module, ColumnParallelLinear):
        parts = full.split([rows * tp.size for rows in module.sections])  # q | k | v, or one part
        return torch.cat([part.chunk(tp.size)[tp.rank] for part in parts])
    if isinstance(module, RowParallelLinear) and leaf == "weight":
        return full.chunk(tp.size, dim=1)[tp.rank]  # [out, in / N]
    return full


def random_full_weights(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, seed: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """The full model's parameters one at a time, exactly as `random_model(spec, dtype, device, seed)`
    draws them (the same generator, order and shapes; on the same kind of device)."""
    layout = empty_model(spec, dtype, torch.device("meta"))  # names and shapes only
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in layout.named_parameters():
        full = torch.empty(param.shape, dtype=dtype, device=device)
        init_parameter(name, full, generator)
        yield name, full
        del full


@torch.no_grad()
def build_shard(
    spec: ModelSpec, tp: TensorParallel, dtype: torch.dtype, device: torch.device, *, seed: int = 0,
    checkpoint: Path | None = None,
) -> CausalLM:  # fmt: skip
    """This rank's model: seeded preset weights, or the checkpoint's, cut for rank `tp.rank`."""
    shard = empty_model(spec, dtype, device, tp)
    params = dict(shard.named_parameters())
    modules = dict(shard.named_modules())
    if checkpoint is None:
        full_weights = random_full_weights(spec, dtype, device, seed)
    else:
        full_weights = load_checkpoint(checkpoint, dtype, torch.device("cpu")).named_parameters()
    filled = set()
    for name, full in full_weights:
        module, _, leaf = name.rpartition(".")
        part = shard_of(modules[module], leaf, full, tp)
        if part.shape != params[name].shape:  # a kvbench bug: layers and cuts disagree
            raise RuntimeError(f"{name}: shard {tuple(part.shape)} != parameter {tuple(params[name].shape)}")
        params[name].copy_(part)
        filled.add(name)
    if filled != set(params):
        raise RuntimeError(f"parameters left unset in the shard: {sorted(set(params) - filled)}")
    return shard
