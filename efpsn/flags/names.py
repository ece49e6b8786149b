"""The run parameters as the outside names them, and what is checked before a network starts.

Torch-free and argparse-free, so the launcher, the coordinator and the compose file use it as the
command line does (efpsn/flags/arguments.py builds the flags): a parameter's flag and environment
variable, the rule a network resolves a run by, a --data-dir folder's agreement with the values
given, the networked key policy, and the config's one crossing to the coordinator (a
RunParameters file).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from efpsn.params.checks import LOCAL_DATA
from efpsn.params.config import Declaration, RunConfig, declarations
from efpsn.params.schema import check_standard_masks, parse_shape

if TYPE_CHECKING:
    from efpsn.data.folders import DataDirLayout

__all__ = ["check_flags_against_folder", "check_key_policy", "environment_variable",
           "flag_of", "folder_values", "network_resolved", "run_parameter_variables",
           "run_parameters_args"]


def flag_of(name: str, declared: Declaration) -> str:
    """The command-line flag of a run parameter: --NAME with dashes, unless declared."""
    return declared.flag or "--" + name.replace("_", "-")


def environment_variable(flag: str) -> str:
    """The environment variable of a run parameter's flag: --key-bits -> EFPSN_KEY_BITS."""
    return "EFPSN_" + flag.lstrip("-").replace("-", "_").upper()


def run_parameter_variables() -> tuple[str, ...]:
    """Every run parameter's environment variable (and EFPSN_PRESET's), in declaration order:
    what docker-compose.yml and the Swarm stack pass to the coordinator (`--from-environment`)."""
    return ("EFPSN_PRESET", *(environment_variable(flag_of(f.name, declared))
                              for f, declared in declarations()))


def network_resolved(config: RunConfig) -> RunConfig:
    """network_config's rule on a config already built (the coordinator's --run-parameters)."""
    if not config.scale.standard:
        return config.resolved()
    check_standard_masks(config.scale, mask=config.mask, refresh=config.refresh)
    config.resolved()  # the step rule's own checks fail here, in one line, not in the agents
    return config


def check_key_policy(config: RunConfig, *, allow_insecure_keys: bool) -> None:
    """Networked runs refuse Paillier keys below 2048 bits unless a test explicitly allows it."""
    from efpsn.crypto.paillier import MIN_KEY_BITS

    if config.key_bits < MIN_KEY_BITS and not allow_insecure_keys:
        raise ValueError(
            f"key_bits must be >= {MIN_KEY_BITS} for a networked run, got {config.key_bits}"
        )


def check_flags_against_folder(given: dict[str, Any], layout: DataDirLayout, *,
                               label_column: str | None = None) -> None:
    """ValueError, one line naming the flag, the folder and the fix, for a flag given with
    --data-dir that the folder contradicts (a run that would fail, or leave a party out: the
    agent count, the data, the schema, a graph of another size) or
    makes meaningless (a flag that would be silently ignored). --scale may differ from
    schema.json's: a public preprocessing of one's choice (with a step size of one's own)."""
    root, count = layout.root, layout.agents
    if "agents" in given and given["agents"] != count:
        raise ValueError(
            f"--agents {given['agents']} disagrees with --data-dir {root}: it holds {count} "
            f"agent folders (agent1..agent{count}), one per party; drop --agents (the folder "
            f"sets the count), or add or remove agent folders")
    if "data" in given and given["data"] != LOCAL_DATA:
        raise ValueError(
            f"--data {given['data']} disagrees with --data-dir {root}: with --data-dir every "
            f"agent reads its own folder; drop --data, or drop --data-dir to use "
            f"{given['data']}")
    if "topology" in given:
        from efpsn.topology import build_graph

        try:
            build_graph(given["topology"], count, seed=given.get("seed", 0))
        except ValueError as exc:
            raise ValueError(f"--topology {given['topology']} on the {count} agent folders of "
                             f"--data-dir {root}: {exc}") from None
    schema = layout.schema
    if ("input_shape" in given and schema.input_shape is not None
            and parse_shape(given["input_shape"]) != parse_shape(schema.input_shape)):
        raise ValueError(
            f"--input-shape {given['input_shape']} disagrees with {root}/schema.json "
            f"(input_shape {schema.input_shape}); drop --input-shape (the folder's schema "
            f"applies), or correct schema.json")
    if "classes" in given and schema.classes is not None and given["classes"] != schema.classes:
        raise ValueError(
            f"--classes {given['classes']} disagrees with {root}/schema.json (classes "
            f"{schema.classes}); drop --classes (the folder's schema applies), or correct "
            f"schema.json")
    for name, instead in (("partition", "each agent's folder is its part"),
                          ("test_fraction", ("the public test set is the folder's test "
                                             "file, and --holdout sets each agent's held-out "
                                             "part"))):
        if name in given:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} cuts one data set by index; with --data-dir {root} "
                             f"{instead}: drop {flag}")
    if label_column is not None and layout.format != "csv":
        raise ValueError(f"--label-column {label_column} names a column of .csv files, but "
                         f"--data-dir {root} holds train.{layout.format} (labels in y): drop "
                         f"--label-column")


def folder_values(layout: DataDirLayout, given: dict[str, Any],
                   label_column: str | None) -> dict[str, Any]:
    from efpsn.data.folder_schema import folder_run_values

    values: dict[str, Any] = layout.run_values()
    shape = (("--input-shape", given["input_shape"]) if "input_shape" in given else
             ("schema.json's input_shape", layout.schema.input_shape)
             if layout.schema.input_shape else None)
    values.update(folder_run_values(
        layout.root, layout.files, layout.test, label_column=layout.label_column(label_column),
        input_shape=None if shape is None else (shape[1], shape[0]),
        classes=given.get("classes", layout.schema.classes),
        scale=given.get("scale", layout.schema.scale)))
    return values


def run_parameters_args(config: RunConfig, folder: Path) -> list[str]:
    """The coordinator's flags for `config`: `--run-parameters FILE` with the run written to
    folder/run-parameters.pb as one efpsn.v1.RunParameters message, the form the coordinator
    hands on to the agents (the config crosses each process boundary once, not as flags)."""
    from efpsn.wire.records import encode_run_parameters

    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "run-parameters.pb"
    path.write_bytes(encode_run_parameters(config.to_dict()))
    return ["--run-parameters", str(path)]
