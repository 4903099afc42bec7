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
            self.flag.lstrip("-").replace("-", "_") if self.flag else self.field,
            inspect.Parameter.KEYWORD_ONLY,
            default=default,
            annotation=Annotated[self.kind, option],
        )

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
    _Flag("num_requests", int | None, "Requests (default: 1000 generated, or every row of a file)."),
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


def with_workload(command=None, *, source_argument: bool = False):
    """Append the workload flags to `command`'s options; call it with `workload=WorkloadSpec`.

    Typer reads a command's options from its signature, so the wrapper advertises the command's
    own parameters (minus `workload`) plus one keyword parameter per flag, defaulting to
    `WorkloadSpec`'s defaults. With `source_argument`, the source is the positional SPEC.
    """
    if command is None:
        return functools.partial(with_workload, source_argument=source_argument)
    defaults = WorkloadSpec()
    params = [
        flag.argument()
        if source_argument and flag.field == "source"
        else flag.parameter(getattr(defaults, flag.field))
        for flag in _FLAGS
    ]
    names = {param.name: flag.field for param, flag in zip(params, _FLAGS, strict=True)}
    own = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def wrapper(**kwargs):
        spec = WorkloadSpec(**{names[name]: kwargs.pop(name) for name in names})
        return command(workload=spec, **kwargs)

    kept = [p for p in own.parameters.values() if p.name != "workload"]
    wrapper.__signature__ = own.replace(parameters=kept + params)
    wrapper.__annotations__ = {p.name: p.annotation for p in kept + params}
    return wrapper


def user_errors(command):
    """Turn a KvbenchError into `error: <one line>` on stderr and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KvbenchError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None

    return wrapper
