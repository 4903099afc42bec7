"""What the CLI's commands share: the workload options and error handling.

`with_workload` gives a command every workload flag (`--trace`, `--rate`, `--prefix`, ...)
and hands it one frozen `WorkloadSpec` instead, so `simulate` and `trace make` cannot drift
apart and config.json records exactly what was asked for.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_burstiness, check_flags, check_workload
from workloads.presets import PRESETS
from workloads.spec import ARRIVALS, WorkloadSpec

_PANEL = "Workload"


@dataclass(frozen=True)
class _Flag:
    field: str  # WorkloadSpec field it sets
    kind: Any  # its type
    help: str
    flag: str | None = None  # spelled otherwise than --<field with dashes>

    def parameter(self, default: Any) -> inspect.Parameter:
        names = (self.flag,) if self.flag else ()
        option = typer.Option(*names, help=self.help, rich_help_panel=_PANEL)
        return inspect.Parameter(
            self.flag.split("/")[0].lstrip("-").replace("-", "_") if self.flag else self.field,
            inspect.Parameter.KEYWORD_ONLY,
            default=default,
            annotation=Annotated[self.kind, option],
        )

    def args(self, value: Any) -> list[str]:
        """This flag set to `value` on a command line (`--rate 2.0`, `--no-cuda-graphs`)."""
        name = self.flag or "--" + self.field.replace("_", "-")
        if isinstance(value, bool):
            on, _, off = name.partition("/")
            return [on if value else (off or "--no-" + on.removeprefix("--"))]
        return [name, repr(value) if isinstance(value, float) else str(value)]

    def argument(self) -> inspect.Parameter:
        """This flag as the command's required positional argument (`trace make SPEC`)."""
        return inspect.Parameter(
            "spec",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[self.kind, typer.Argument(help=self.help)],
        )


_FLAGS = (
    _Flag(
        "source", str, f"Preset ({', '.join(PRESETS)}), a spec (fixed:/uniform:/lognormal:/empirical:FILE/"
        "sharegpt:FILE/alpaca:FILE/dataset:PATH?prompt=A&response=B) or a trace file.", "--trace",
    ),
    _Flag("num_requests", int | None, "Requests, at most 10 M (default: 1000 generated, or a file's rows)."),
    _Flag("seed", int, "Seed for lengths, arrivals and sharing."),
    _Flag("arrivals", str | None, f"{', '.join(ARRIVALS)} (default: replay timestamps, else poisson)."),
    _Flag("rate", float | None, "Requests/s for poisson, gamma, constant."),
    _Flag("burstiness", float, "Gamma shape: 1 is Poisson, below 1 burstier."),
    _Flag("time_scale", float, "Replay: 2 plays the timestamps twice as fast."),
    _Flag("window_start_s", float, "Replay: first second of the trace to keep.", "--window-start"),
    _Flag("window_duration_s", float | None, "Replay: seconds of the trace to keep.", "--window-duration"),
    _Flag("max_total_len", int | None, "Drop (and count) requests whose prompt + output exceed this."),
    _Flag("tokenizer", str | None, "Text datasets: local tokenizer folder."),
    _Flag("text_filter", bool, "Text datasets: vLLM's length filter (skips are counted)."),
    _Flag("n", int, "Parallel samples per request.", "--n"),
    _Flag("beam_width", int, "Beam search width."),
    _Flag("prefix", str | None, "Shared prefix: tokens, or fewshot-1 (80) / fewshot-5 (341)."),
    _Flag("prefix_groups", int, "Distinct shared prefixes."),
    _Flag("chat_turns", int | None, "Turns per conversation (multi-turn chat)."),
    _Flag("max_history", int, "Chat: prompt = history cut to the last L tokens."),
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
    tensor_parallel: int = 1
    collectors: str = "torch,nvml,roofline"
    hf_batch_size: int = 32
    hf_block_size: int | None = None
    hf_memory: float | None = None
    hf_attn: str = "paged|sdpa"


_REAL_FLAGS = (
    _Flag("device", str, "Device to decode on: cuda, cuda:N or cpu."),
    _Flag("dtype", str, "auto (bf16 on GPUs, fp32 on CPU), float16, bfloat16 or float32."),
    _Flag("temperature", float, "0: greedy; above 0: seeded sampling, identical for every engine."),
    _Flag("weights_seed", int, "Seed of a preset's random weights and of sampling."),
    _Flag("attention", str, "auto (Triton kernels on CUDA), triton, or torch (the PyTorch reference)."),
    _Flag(
        "cuda_graphs",
        bool,
        "Replay decode steps as CUDA graphs (CUDA with the Triton kernels).",
        "--cuda-graphs/--no-cuda-graphs",
    ),
    _Flag("tensor_parallel", int, "Split the model across this many GPUs of the host (budget: the model's)."),
    _Flag("collectors", str, "CUDA runs: torch (allocator), nvml (memory, power), roofline; or none."),
    _Flag("hf_batch_size", int, "hf-generate: requests per padded generate() batch."),
    _Flag("hf_block_size", int | None, "hf-cb: tokens per cache block (default: transformers', 256)."),
    _Flag("hf_memory", float | None, "hf-cb: share of free GPU memory for its cache (default: KV budget)."),
    _Flag("hf_attn", str, "hf-*: paged|sdpa, paged|eager, paged|flash_attention_2, paged|flash_attention_3."),
)


def _with_group(command, name: str, cls: type, flags: tuple[_Flag, ...], source_argument: bool = False):
    """Append `flags` to `command`'s options and call it with `name=cls(**flag values)`.

    Typer reads a command's options from its signature, so the wrapper advertises the command's
    own parameters (minus `name`) plus one keyword parameter per flag, defaulting to `cls`'s
    defaults. With `source_argument`, the `source` flag becomes the positional SPEC.
    """
    defaults = cls()
    params = [
        flag.argument()
        if source_argument and flag.field == "source"
        else flag.parameter(getattr(defaults, flag.field))
        for flag in flags
    ]
    fields = {param.name: flag.field for param, flag in zip(params, flags, strict=True)}
    own = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def wrapper(**kwargs):
        group = cls(**{fields[key]: kwargs.pop(key) for key in fields})
        if isinstance(group, WorkloadSpec):
            check_workload(group)  # flags one another would silently undo (--arrivals all --rate 5)
            check_burstiness(group)
        return command(**{name: group}, **kwargs)

    kept = [p for p in own.parameters.values() if p.name != name]
    wrapper.__signature__ = own.replace(parameters=kept + params)
    wrapper.__annotations__ = {p.name: p.annotation for p in kept + params}
    return wrapper


def with_workload(command=None, *, source_argument: bool = False, omit: tuple[str, ...] = ()):
    """The workload flags (`--trace`, `--rate`, ...), passed as `workload=WorkloadSpec(...)`.

    `omit`: WorkloadSpec fields left out of the flags (at their defaults), for a command that
    sets them otherwise (`sweep` takes lists: `--rates`, `--seeds`, repeated `--trace`).
    """
    if command is None:
        return functools.partial(with_workload, source_argument=source_argument, omit=omit)
    flags = tuple(flag for flag in _FLAGS if flag.field not in omit)
    return _with_group(command, "workload", WorkloadSpec, flags, source_argument)


def group_args(value: WorkloadSpec | RealOptions) -> list[str]:
    """The flags that rebuild `value` from its defaults: a command line for a subprocess."""
    flags = _FLAGS if isinstance(value, WorkloadSpec) else _REAL_FLAGS
    defaults = type(value)()
    args = []
    for flag in flags:
        setting = getattr(value, flag.field)
        if setting != getattr(defaults, flag.field):
            if setting is None:
                raise ValueError(f"{flag.field}=None cannot be given as a flag")  # a kvbench bug
            args += flag.args(setting)
    return args


def with_real(command):
    """The real-run flags (`--device`, `--dtype`, ...), passed as `real=RealOptions(...)`."""
    return _with_group(command, "real", RealOptions, _REAL_FLAGS)


def without(command, **fixed):
    """`command` with parameters `fixed` removed from its options and given these values."""
    own = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def wrapper(**kwargs):
        return command(**fixed, **kwargs)

    kept = [p for p in own.parameters.values() if p.name not in fixed]
    wrapper.__signature__ = own.replace(parameters=kept)
    wrapper.__annotations__ = {p.name: p.annotation for p in kept}
    return wrapper


def user_errors(command):
    """Check every numeric flag's range (`kvbench.flag_ranges`) before the command runs, and
    turn a KvbenchError into `error: <one line>` on stderr and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            check_flags(kwargs)
            return command(*args, **kwargs)
        except KvbenchError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None

    return wrapper
