"""The two linear layers of Megatron-style tensor parallelism, and a rank's place in the group.

A column-parallel linear keeps this rank's share of the output features (whole attention
heads, a slice of the MLP's inner width): its input is the full hidden state, its output
stays split, and nothing is communicated. A row-parallel linear takes that split input and
multiplies it by the matching columns of the weight, so every rank holds a partial sum of
the full output; one all-reduce adds them up. A transformer layer is therefore

    h [T, hidden] -> qkv (column) -> attention on this rank's heads -> o_proj (row) -> all-reduce
                  -> fc1 / gate_up (column) -> activation -> fc2 / down (row) -> all-reduce

two all-reduces per layer. With one rank both layers are exactly `nn.Linear` (the same
parameters, the same call), so single-process numerics do not move.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TensorParallel:
    """This process's place: rank `rank` of `size`, talking over torch.distributed's default group."""

    rank: int = 0
    size: int = 1


SINGLE = TensorParallel()  # one process: no communication


class Linear(nn.Linear):
    """`nn.Linear` without torch's default initialisation: kvbench fills every weight itself
    (`modeling.weights`: seeded random weights or a checkpoint). Models are built on the meta
    device, where torch's initialisers import torch._dynamo: seconds of every process's start."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    """`nn.Embedding` without torch's default initialisation (see `Linear`)."""

    def reset_parameters(self) -> None:
        pass


class ColumnParallelLinear(Linear):
    """`nn.Linear` keeping this rank's rows of each part of a packed weight.

    `sections` are the full model's output sizes of the parts stacked in the weight (q, k, v;
    gate, up; or a single part); each part is split evenly, so rank r holds rows
    `[r * s / N, (r + 1) * s / N)` of every part `s`, and its output splits by `self.sections`.
    """

    def __init__(
        self, in_features: int, sections: tuple[int, ...], tp: TensorParallel, bias: bool = True, **factory
    ) -> None:
        self.sections = tuple(part // tp.size for part in sections)  # this rank's rows of each part
        super().__init__(in_features, sum(self.sections), bias=bias, **factory)


class RowParallelLinear(Linear):
    """`nn.Linear` over this rank's slice of the input features, summed across ranks.

    Rank r holds columns `[r * in / N, (r + 1) * in / N)` of the weight and the whole bias,
    added once after the all-reduce.
    """

    def __init__(
        self, in_features: int, out_features: int, tp: TensorParallel, bias: bool = True, **factory
    ) -> None:
        super().__init__(in_features // tp.size, out_features, bias=bias, **factory)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x)
        y = F.linear(x, self.weight)  # [T, out] this rank's partial sum
        dist.all_reduce(y)  # the full product, identical on every rank
        return y if self.bias is None else y + self.bias
