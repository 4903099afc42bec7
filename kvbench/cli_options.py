"""What the CLI's commands share: workload options (simulate, trace make) and error handling.

Each alias carries its flag's help once; the commands pass the parsed values on to the frozen
`WorkloadSpec` that config.json records.
"""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from kvbench.errors import KvbenchError
from workloads.presets import PRESETS
from workloads.spec import ARRIVALS

_W = "Workload"
Trace = Annotated[
    str,
    typer.Option(
        help=f"Preset ({', '.join(PRESETS)}), a spec (fixed:/uniform:/lognormal:/empirical:FILE/"
        "sharegpt:FILE/alpaca:FILE/dataset:PATH?prompt=A&response=B) or a trace file.",
        rich_help_panel=_W,
    ),
]
NumRequests = Annotated[
    int | None,
    typer.Option(help="Requests (default: 1000 generated, or every row of a file).", rich_help_panel=_W),
]
Seed = Annotated[int, typer.Option(help="Seed for lengths, arrivals and sharing.", rich_help_panel=_W)]
Arrivals = Annotated[
    str | None,
    typer.Option(
        help=f"{', '.join(ARRIVALS)} (default: replay a file's timestamps, else poisson).", rich_help_panel=_W
    ),
]
Rate = Annotated[
    float | None, typer.Option(help="Requests/s for poisson, gamma, constant.", rich_help_panel=_W)
]
Burstiness = Annotated[
    float, typer.Option(help="Gamma shape: 1 is Poisson, below 1 burstier.", rich_help_panel=_W)
]
TimeScale = Annotated[
    float, typer.Option(help="Replay: 2 plays the timestamps twice as fast.", rich_help_panel=_W)
]
WindowStart = Annotated[
    float, typer.Option(help="Replay: first second of the trace to keep.", rich_help_panel=_W)
]
WindowDuration = Annotated[
    float | None, typer.Option(help="Replay: seconds of the trace to keep.", rich_help_panel=_W)
]
Tokenizer = Annotated[
    str | None, typer.Option(help="Text datasets: local tokenizer folder.", rich_help_panel=_W)
]
TextFilter = Annotated[
    bool, typer.Option(help="Text datasets: vLLM's length filter (skips are counted).", rich_help_panel=_W)
]
N = Annotated[int, typer.Option("--n", help="Parallel samples per request.", rich_help_panel=_W)]
BeamWidth = Annotated[int, typer.Option(help="Beam search width.", rich_help_panel=_W)]
Prefix = Annotated[
    str | None,
    typer.Option(help="Shared prefix: tokens, or fewshot-1 (80) / fewshot-5 (341).", rich_help_panel=_W),
]
PrefixGroups = Annotated[int, typer.Option(help="Distinct shared prefixes.", rich_help_panel=_W)]
ChatTurns = Annotated[
    int | None, typer.Option(help="Turns per conversation (multi-turn chat).", rich_help_panel=_W)
]
MaxHistory = Annotated[
    int, typer.Option(help="Chat: prompt = history cut to the last L tokens.", rich_help_panel=_W)
]


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


MaxTotalLen = Annotated[
    int | None,
    typer.Option(help="Drop (and count) requests whose prompt + output exceed this.", rich_help_panel=_W),
]
