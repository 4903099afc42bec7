"""What the CLI's commands share: the workload options and error handling.

`with_workload` gives a command every workload flag (`--trace`, `--rate`, `--prefix`, ...)
and hands it one frozen `WorkloadSpec` instead, so `simulate` and `trace make` cannot drift
apart and config.json records exactly what was asked for.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from kvbench.config import ENGINE_FIELDS, RunConfig, engine_reads
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_burstiness, check_dependents, check_flags, check_workload
from kvbench.flags import REAL_FLAGS, WORKLOAD_FLAGS, Flag, RealOptions
from workloads.spec import WorkloadSpec

_PANEL = "Workload"


def _parameter(flag: Flag, default: Any) -> inspect.Parameter:
    """This flag as a keyword parameter typer reads as an option."""
    names = (flag.flag,) if flag.flag else ()
    option = typer.Option(*names, help=flag.help, rich_help_panel=_PANEL)
    return inspect.Parameter(
        flag.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[flag.kind, option]
    )


def _argument(flag: Flag) -> inspect.Parameter:
    """This flag as the command's required positional argument (`trace make SPEC`)."""
    return inspect.Parameter(
        "spec",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[flag.kind, typer.Argument(help=flag.help)],
    )


def _with_group(command, name: str, cls: type, flags: tuple[Flag, ...], source_argument: bool = False):
    """Append `flags` to `command`'s options and call it with `name=cls(**flag values)`.

    Typer reads a command's options from its signature, so the wrapper advertises the command's
    own parameters (minus `name`) plus one keyword parameter per flag, defaulting to `cls`'s
    defaults. With `source_argument`, the `source` flag becomes the positional SPEC.
    """
    defaults = cls()
    params = [
        _argument(flag)
        if source_argument and flag.field == "source"
        else _parameter(flag, getattr(defaults, flag.field))
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
            check_dependents(group)
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
    flags = tuple(flag for flag in WORKLOAD_FLAGS if flag.field not in omit)
    return _with_group(command, "workload", WorkloadSpec, flags, source_argument)


def with_real(command):
    """The real-run flags (`--device`, `--dtype`, ...), passed as `real=RealOptions(...)`."""
    return _with_group(command, "real", RealOptions, REAL_FLAGS)


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


DeadlineOption = Annotated[
    float | None,
    typer.Option(
        help="Seconds this invocation may run (a time-limited GPU call): start no cell expected to "
        "end later (the longest finished cell of its kind, + 10 %), stop there with exit code 75, "
        "resumable."
    ),
]


def deadline(seconds: float | None):
    """`--deadline-s` as a `kvbench.sweep.deadline.Deadline` counted from now (None: none)."""
    from kvbench.sweep.deadline import Deadline

    return None if seconds is None else Deadline.in_seconds(seconds)


def user_errors(command):
    """Check every numeric flag's range (`kvbench.flag_ranges`) before the command runs, and
    turn a KvbenchError into `error: <one line>` on stderr and exit code 2; a sweep stopped by
    its `--deadline-s` says so in one line and exits with `DEADLINE_EXIT`."""
    from kvbench.sweep.deadline import DEADLINE_EXIT, DeadlineReached

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            check_flags(kwargs)
            return command(*args, **kwargs)
        except KvbenchError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None
        except DeadlineReached as stop:
            typer.echo(f"stopped: {stop}", err=True)
            raise typer.Exit(DEADLINE_EXIT) from None

    return wrapper


def named_path(value: str) -> Path:
    """A path argument that must name something (`typer.Argument(parser=named_path)`): click
    reads an empty one as the current folder (`kvbench report ''` compared, and wrote into,
    wherever the shell stood). '.' still names it."""
    from kvbench.results.load import folder_path  # pandas: only where a command takes such a path

    try:
        return folder_path(value)
    except KvbenchError as error:  # click's own form: the parameter named, exit code 2
        raise typer.BadParameter(str(error)) from None


def given(ctx: typer.Context, name: str) -> bool:
    """Whether parameter `name` was typed (or set by the environment), not left at its default:
    an option another one makes the command ignore must be refused only when the user gave it.
    Compared by name: typer may parse with its own copy of click's ParameterSource."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def has_cuda() -> bool:
    """Whether torch is installed and sees a CUDA GPU (imported only to ask)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# What each of `kvbench.config.ENGINE_FIELDS` sets, for the refusal of a flag no engine reads
ENGINE_FLAGS: dict[str, str] = {
    "block_size": "sizes the blocks of block-table engines",
    "contiguous_fit": "places the extents of contiguous engines",
    "watermark": "keeps memory free at admission in block-table and vmm engines",
    "preemption": "swaps the blocks of paged engines' victims to host memory",
    "swap_space_gib": "sizes the host memory paged engines swap blocks to",
    "vmm_layout": "sets up the vmm engine's arena",
    "vmm_page_kib": "sets up the vmm engine's arena",
    "vmm_map": "sets up the vmm engine's arena",
}


def refuse_unread_engine_flags(
    engines: Sequence[str], values: Mapping[str, object], shown: Mapping[str, str] | None = None
) -> None:
    """A flag of `ENGINE_FLAGS` given (not at its default) where no engine of `engines` reads it,
    or --swap-space-gib without --preemption swap, would be ignored while config.json recorded it
    as if it had shaped the run: refused, naming the flag. `values`: flag fields to values (those
    left out are at their defaults); `shown`: a field's flag and value as the command takes them,
    where that is not `--<field> <value>` (sweep's --block-sizes)."""
    defaults = RunConfig.__dataclass_fields__
    reads = frozenset().union(*(engine_reads(engine) for engine in engines))
    for name, what in ENGINE_FLAGS.items():
        value = values.get(name, defaults[name].default)
        if value == defaults[name].default or (name == "preemption" and value != "swap"):
            continue  # (a preemption neither recompute nor swap is refused as unknown, by kvbench.config)
        flag = (shown or {}).get(name) or f"--{name.replace('_', '-')} {value}"
        if ENGINE_FIELDS[name] not in reads:
            verb = "reads" if len(engines) == 1 else "read"
            raise KvbenchError(f"{flag} {what}, which {', '.join(engines)} never {verb}: leave it out")
        if name == "swap_space_gib" and values.get("preemption", defaults["preemption"].default) != "swap":
            raise KvbenchError(f"{flag} {what} under --preemption swap, which is not given: leave it out")
