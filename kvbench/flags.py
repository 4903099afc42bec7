"""kvbench's command-line flags as data: each workload and real-run flag's field, type, help
and spelling, and the command line that rebuilds a setting.

The CLI (`kvbench.cli.options`) turns these into typer options; a sweep (`kvbench.sweep.cell`)
turns a cell's setting back into the same flags for the subprocess that runs it, so the two
cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.presets import PRESETS
from workloads.spec import ARRIVALS, WorkloadSpec


@dataclass(frozen=True)
class Flag:
    field: str  # the WorkloadSpec or RealOptions field it sets
    kind: Any  # its type
    help: str
    flag: str | None = None  # spelled otherwise than --<field with dashes>

    def args(self, value: Any) -> list[str]:
        """This flag set to `value` on a command line (`--rate 2.0`, `--no-cuda-graphs`)."""
        name = self.flag or "--" + self.field.replace("_", "-")
        if isinstance(value, bool):
            on, _, off = name.partition("/")
            return [on if value else (off or "--no-" + on.removeprefix("--"))]
        return [name, repr(value) if isinstance(value, float) else str(value)]

    @property
    def option(self) -> str:
        """The flag as a message names it, its first spelling: `--trace`, `--cuda-graphs`."""
        return (self.flag or "--" + self.field.replace("_", "-")).split("/")[0]

    @property
    def name(self) -> str:
        """The Python parameter name typer gives this flag."""
        return self.flag.split("/")[0].lstrip("-").replace("-", "_") if self.flag else self.field


WORKLOAD_FLAGS = (
    Flag(
        "source", str, f"Preset ({', '.join(PRESETS)}), a spec (fixed:/uniform:/lognormal:/empirical:FILE/"
        "sharegpt:FILE/alpaca:FILE/dataset:PATH?prompt=A&response=B) or a trace file.", "--trace",
    ),
    Flag("num_requests", int | None, "Requests, at most 10 M (default: 1000 generated, or a file's rows)."),
    Flag("seed", int, "Seed for lengths, arrivals and sharing."),
    Flag("arrivals", str | None, f"{', '.join(ARRIVALS)} (default: replay timestamps, else poisson)."),
    Flag("rate", float | None, "Requests/s for poisson, gamma, constant."),
    Flag("burstiness", float, "Gamma shape: 1 is Poisson, below 1 burstier."),
    Flag("time_scale", float, "Replay: 2 plays the timestamps twice as fast."),
    Flag("window_start_s", float, "Replay: first second of the trace to keep.", "--window-start"),
    Flag("window_duration_s", float | None, "Replay: seconds of the trace to keep.", "--window-duration"),
    Flag("max_total_len", int | None, "Drop (and count) requests whose prompt + output exceed this."),
    Flag("tokenizer", str | None, "Text datasets: local tokenizer folder."),
    Flag("text_filter", bool, "Text datasets: vLLM's length filter (skips are counted)."),
    Flag("n", int, "Parallel samples per request.", "--n"),
    Flag("beam_width", int, "Beam search width."),
    Flag("prefix", str | None, "Shared prefix: tokens, or fewshot-1 (80) / fewshot-5 (341)."),
    Flag("prefix_groups", int, "Distinct shared prefixes."),
    Flag("chat_turns", int | None, "Turns per conversation (multi-turn chat)."),
    Flag("max_history", int, "Chat: prompt = history cut to the last L tokens."),
)  # fmt: skip


@dataclass(frozen=True)
class RealOptions:
    """What only a real run needs, beside a simulation's options."""

    device: str = "cuda"
    dtype: str = "auto"
    temperature: float = 0.0
    weights_seed: int = 0
    attention: str = "auto"
    cuda_graphs: bool = True
    prefill_graphs: bool = False
    expert_dispatch: str = "auto"
    tensor_parallel: int = 1
    collectors: str = "torch,nvml,roofline"
    hf_batch_size: int = 32
    hf_block_size: int | None = None
    hf_memory: float | None = None
    hf_attn: str = "paged|sdpa"


REAL_FLAGS = (
    Flag("device", str, "Device to decode on: cuda, cuda:N or cpu."),
    Flag("dtype", str, "auto (bf16 on GPUs, fp32 on CPU), float16, bfloat16 or float32."),
    Flag("temperature", float, "0: greedy; above 0: seeded sampling, identical for every engine."),
    Flag("weights_seed", int, "Seed of a preset's random weights and of sampling."),
    Flag("attention", str, "auto (Triton kernels on CUDA), triton, or torch (the PyTorch reference)."),
    Flag(
        "cuda_graphs",
        bool,
        "Replay decode steps as CUDA graphs (CUDA with the Triton kernels).",
        "--cuda-graphs/--no-cuda-graphs",
    ),
    Flag(
        "prefill_graphs",
        bool,
        "Short prefills (<= 256 tokens, <= 16 prompts) from static buffers, as CUDA graphs where "
        "decode steps are: no longer host-bound (kvbench/real/prefill_graphs.py).",
        "--prefill-graphs/--no-prefill-graphs",
    ),
    Flag(
        "expert_dispatch",
        str,
        "MoE models: a decode step runs every expert over every row (dense) or each token's chosen "
        "experts only, grouped (grouped); auto: grouped on a model with experts, dense otherwise.",
    ),
    Flag("tensor_parallel", int, "Split the model across this many GPUs of the host (budget: the model's)."),
    Flag("collectors", str, "CUDA runs: torch (allocator), nvml (power), roofline, host (CPU); or none."),
    Flag("hf_batch_size", int, "hf-generate: requests per padded generate() batch."),
    Flag("hf_block_size", int | None, "hf-cb: tokens per cache block (default: transformers', 256)."),
    Flag("hf_memory", float | None, "hf-cb: share of free GPU memory for its cache (default: KV budget)."),
    Flag("hf_attn", str, "hf-*: paged|sdpa, paged|eager, paged|flash_attention_2, paged|flash_attention_3."),
)


def group_args(value: WorkloadSpec | RealOptions) -> list[str]:
    """The flags that rebuild `value` from its defaults: a command line for a subprocess."""
    flags = WORKLOAD_FLAGS if isinstance(value, WorkloadSpec) else REAL_FLAGS
    defaults = type(value)()
    args = []
    for flag in flags:
        setting = getattr(value, flag.field)
        if setting != getattr(defaults, flag.field):
            if setting is None:
                raise ValueError(f"{flag.field}=None cannot be given as a flag")  # a kvbench bug
            args += flag.args(setting)
    return args


def first_set(real: RealOptions, prefix: str = "") -> str | None:
    """The command-line words of the first real-run flag (of the fields starting with `prefix`)
    set away from its default, None where none is: what a command that would ignore it names."""
    defaults = RealOptions()
    for flag in REAL_FLAGS:
        value = getattr(real, flag.field)
        if flag.field.startswith(prefix) and value != getattr(defaults, flag.field):
            return " ".join(flag.args(value))
    return None
