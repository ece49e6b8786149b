"""Run parameters as environment variables (the containers' way in: docker-compose.yml and the
Swarm stack start the coordinator with --from-environment), and `efpsn compose --agents N`."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cli import build_parser
from efpsn.cli.compose import compose_variables, render_compose
from efpsn.flags.arguments import apply_environment, config_from_args
from efpsn.flags.names import environment_variable, flag_of, run_parameter_variables
from efpsn.params.config import declarations


def _config(argv: list[str], environ: dict[str, str]):
    args = build_parser().parse_args(["--insecure", *argv])
    apply_environment(args, environ)
    return config_from_args(args)


def test_every_run_parameter_has_one_variable_named_from_its_flag() -> None:
    variables = run_parameter_variables()
    assert len(set(variables)) == len(variables)  # --K and --m, --N and --p: no two collide
    assert variables[0] == "EFPSN_PRESET"
    for f, declared in declarations():
        assert environment_variable(flag_of(f.name, declared)) in variables
    assert environment_variable("--key-bits") == "EFPSN_KEY_BITS"
    assert environment_variable("--round-timeout") == "EFPSN_ROUND_TIMEOUT"


def test_variables_give_what_the_flags_give_and_flags_win() -> None:
    environ = {"EFPSN_GAMMA": "10000", "EFPSN_ALGORITHM": "gt", "EFPSN_KEY_BITS": "2048",
               "EFPSN_ITERATIONS": "300", "EFPSN_REFRESH": "never", "EFPSN_PACKED": "false",
               "EFPSN_SCHEDULE": "constant:0.05", "EFPSN_TOPOLOGY": ""}  # empty: the default
    from_env = _config([], environ)
    from_flags = _config(["--gamma", "10000", "--algorithm", "gt", "--key-bits", "2048",
                          "--iterations", "300", "--refresh", "never", "--no-packed",
                          "--schedule", "constant:0.05"], {})
    assert from_env == from_flags
    assert from_env.topology == "ring"
    # a flag given on the command line wins over its variable
    assert _config(["--gamma", "5"], environ).gamma == 5.0
    # the preset by variable, a flag's variable over the preset
    paper = _config([], {"EFPSN_PRESET": "paper", "EFPSN_ITERATIONS": "300"})
    assert (paper.algorithm, paper.iterations.count) == ("dsgd", 300)


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("EFPSN_ALGORITHM", "agtt", "invalid choice"),
    ("EFPSN_GAMMA", "lots", "EFPSN_GAMMA='lots'"),
    ("EFPSN_PACKED", "maybe", "expected true or false"),
])
def test_a_bad_variable_is_refused_naming_it(variable: str, value: str, said: str) -> None:
    with pytest.raises(ValueError, match=variable) as info:
        apply_environment(argparse.Namespace(), {variable: value})
    assert said in str(info.value)


@pytest.mark.process
def test_the_coordinator_refuses_a_bad_variable_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "coordinator", "--insecure", "--from-environment",
         "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "EFPSN_ALGORITHM": "agtt"}, cwd=Path(__file__).parents[1])
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "EFPSN_ALGORITHM='agtt'" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.process
def test_compose_files_for_any_agent_count(tmp_path: Path) -> None:
    out = tmp_path / "docker-compose.yml"
    done = subprocess.run([sys.executable, "-m", "efpsn", "compose", "--agents", "3", "--out",
                           str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text == render_compose(3)
    assert "  agent3:\n" in text and "agent4" not in text
    assert '--agents, "3"' in text and "results-agent3: {}" in text
    for variable in compose_variables():
        assert f"      {variable}: ${{{variable}:-" in text
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is in the dev extra")
    lint = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.compose-spec", str(out)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    one = subprocess.run([sys.executable, "-m", "efpsn", "compose", "--agents", "1"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert one.returncode == 2 and one.stderr.count("\n") == 1 and "at least 2" in one.stderr
