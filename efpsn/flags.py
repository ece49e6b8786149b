"""The run parameters as command-line flags, built from their declarations in efpsn/config.py.

Every command that takes run parameters (simulate, up, coordinator, privacy, the experiments)
gets its flags here, with the same names, types, defaults and help; `config_to_args` is the
inverse, for starting a service with a config.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from efpsn.config import LOCAL_DATA, PRESETS, Declaration, RunConfig, declarations

__all__ = ["add_run_arguments", "config_from_args", "config_to_args", "flag_of"]

_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def flag_of(name: str, declared: Declaration) -> str:
    """The command-line flag of a run parameter: --NAME with dashes, unless declared."""
    return declared.flag or "--" + name.replace("_", "-")


def _argument_type(name: str, declared: Declaration, kind: str) -> Callable[[str], Any]:
    convert = declared.parse or _PARSERS[kind]

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{name}: {exc}") from None

    parse.__name__ = name  # argparse names the parameter in its messages
    return parse


def add_run_arguments(parser: argparse.ArgumentParser, *,
                      only: Iterable[str] | None = None,
                      title: str = "run parameters (public, identical at every agent)",
                      show_defaults: bool = True) -> None:
    """Add the run parameters (all, or the `only` ones) as flags with their declared help; a
    flag not given stays absent from the namespace, so config_from_args can tell a default
    from a choice. Also --preset (PRESETS). show_defaults=False: the caller's defaults are not
    RunConfig's (e.g. an experiment's profile)."""
    wanted = None if only is None else set(only)
    group = parser.add_argument_group(title)
    if wanted is None:
        group.add_argument("--preset", choices=sorted(PRESETS), default=argparse.SUPPRESS,
                           help="a named set of run parameters (flags given explicitly win): "
                                + "; ".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in
                                                                    values.items())
                                            for name, values in PRESETS.items()))
    for f, declared in declarations():
        if wanted is not None and f.name not in wanted:
            continue
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        shown = declared.show(f.default) if declared.show else f.default
        options: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": f.name,
                                   "help": f"{declared.help} (default {shown})"
                                   if show_defaults else declared.help}
        if kind == "bool":
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = _argument_type(f.name, declared, kind)
            if declared.choices:
                options["choices"] = declared.choices
                options["type"] = str
            options["metavar"] = f.name.upper() if not declared.choices else None
        group.add_argument(flag_of(f.name, declared), **options)


def config_from_args(args: argparse.Namespace, *,
                     derived: dict[str, Any] | None = None) -> RunConfig:
    """The RunConfig of the run flags given. Precedence: flags given, then a --data-dir folder
    (when the parser has it: data "local", its agent count, DIR/schema.json's schema), then
    `derived`, then the preset, then RunConfig's defaults; then the step rule where it was asked for
    (RunConfig.resolved: --schedule auto, iterations 0, a negative momentum)."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    values: dict[str, Any] = dict(PRESETS.get(getattr(args, "preset", ""), {}))
    values.update(derived or {})
    data_dir = getattr(args, "data_dir", None)
    if data_dir:
        from efpsn.datadir import inspect_data_dir

        # the folder implies data "local", the agent count and its schema.json's fields
        values.update(inspect_data_dir(data_dir).run_values())
    elif ("input_shape" in given or "classes" in given) and "data" not in given:
        values["data"] = LOCAL_DATA  # a schema of one's own and no data set named: local data
    values.update(given)
    return RunConfig(**values).resolved()


def config_to_args(config: RunConfig) -> list[str]:
    """The flags that reproduce `config` on another command line (inverse of config_from_args)."""
    out: list[str] = []
    for f, declared in declarations():
        value = getattr(config, f.name)
        flag = flag_of(f.name, declared)
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif declared.show is not None:
            out += [flag, declared.show(value)]
        else:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out
