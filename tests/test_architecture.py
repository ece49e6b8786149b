"""The layout's rules, checked on the source: what each layer may import, module size, no cycles.

- efpsn/ is the pure core plus its command line. Only efpsn.wire (the contract's Python side:
  generated stubs, serde, channels, servers, TLS) imports grpc; only efpsn/crypto/paillier.py
  imports phe.
- agent/ and coordinator/ are the services. They may import the core; the core never imports them
  (the CLI front ends efpsn/cli/main.py and efpsn/experiments/network_check.py start them). Neither
  service imports the other: `efpsn up` starts the coordinator as a process.
- The coordinator is lightweight: its import closure has no torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("efpsn", "agent", "coordinator")
MAX_LINES = 600  # a smell: past it, look for where the responsibilities part
# Front ends of the core that start the services (never imported by the core itself).
SERVICE_FRONT_ENDS = {"efpsn/cli/main.py"}


def _sources() -> list[Path]:
    files = [f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))]
    return [f for f in files if "_pb2" not in f.name]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Absolute module names imported anywhere in the file (or only at module level, outside
    `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def test_the_tree_has_the_specified_top_level() -> None:
    for path in ("proto/efpsn/wire/v1", "agent/__main__.py", "coordinator/__main__.py",
                 "agent/Dockerfile", "coordinator/Dockerfile", "docker-compose.yml", "tests",
                 "pyproject.toml", "efpsn/wire/v1/agent_pb2.py"):
        assert (ROOT / path).exists(), path
    assert not (ROOT / "efpsn" / "agent").exists() and not (ROOT / "efpsn" / "coordinator").exists()


def test_only_the_wire_package_imports_grpc() -> None:
    offenders = [
        _rel(f) for f in _sources()
        if _rel(f).startswith("efpsn/") and not _rel(f).startswith("efpsn/wire/")
        and _top(_imports(f)) & {"grpc", "grpc_health", "grpc_reflection"}
    ]
    assert offenders == []


def test_only_wire_records_serde_and_services_import_the_stubs() -> None:
    users = sorted(_rel(f) for f in _sources()
                   if any(n.startswith("efpsn.wire.v1") for n in _imports(f)))
    core = [u for u in users if u.startswith("efpsn/")]
    assert core == ["efpsn/wire/records.py", "efpsn/wire/rounds.py", "efpsn/wire/serde.py",
                    "efpsn/wire/stats.py", "efpsn/wire/status_client.py"]
    assert all(u.startswith(("agent/", "coordinator/")) for u in users if u not in core)


def test_only_paillier_imports_phe() -> None:
    users = [_rel(f) for f in _sources() if "phe" in _top(_imports(f))]
    assert users == ["efpsn/crypto/paillier.py"]


def test_the_core_never_imports_the_services() -> None:
    offenders = [
        _rel(f) for f in _sources()
        if _rel(f).startswith("efpsn/") and _rel(f) not in SERVICE_FRONT_ENDS
        and _top(_imports(f)) & {"agent", "coordinator"}
    ]
    assert offenders == []


# The command line's rooms (argparse lives there) and the process entry points that parse their
# own few flags: argparse nowhere else.
COMMAND_LINE_ROOMS = ("efpsn/cli/", "efpsn/flags/", "agent/cli.py", "coordinator/cli.py")
ENTRY_POINTS = {"agent/forkserver.py", "efpsn/wire/healthcheck.py"}
# Who may import the command line from outside it: the entry points that run a command, the
# services' commands, and the notebook (which runs `efpsn up` from Python).
COMMAND_LINE_USERS = {"efpsn/__main__.py", "agent/__main__.py", "coordinator/__main__.py",
                      "agent/cli.py", "coordinator/cli.py", "agent/forkserver.py",
                      "efpsn/notebook.py"}


def test_argparse_only_in_the_command_line_rooms_and_process_entry_points() -> None:
    users = {_rel(f) for f in _sources() if "argparse" in _top(_imports(f))}
    offenders = {u for u in users if not u.startswith(COMMAND_LINE_ROOMS)} - ENTRY_POINTS
    assert offenders == set()
    assert users >= {"efpsn/cli/main.py", "efpsn/flags/arguments.py", "agent/cli.py"}  # the check sees


def test_nothing_below_the_command_line_imports_it() -> None:
    users = {_rel(f) for f in _sources() if not _rel(f).startswith("efpsn/cli/")
             and any(n == "efpsn.cli" or n.startswith("efpsn.cli.") for n in _imports(f))}
    assert users <= COMMAND_LINE_USERS, users - COMMAND_LINE_USERS
    assert "agent/results.py" not in users  # its JSON helpers are the core's (efpsn/jsonfile.py)


def test_the_services_do_not_import_each_other() -> None:
    assert [_rel(f) for f in _sources()
            if _rel(f).startswith("agent/") and "coordinator" in _top(_imports(f))] == []
    assert [_rel(f) for f in _sources()
            if _rel(f).startswith("coordinator/") and "agent" in _top(_imports(f))] == []


def _top_level_names(path: Path) -> tuple[set[str], set[str]]:
    """(names a module defines, names it imports from a module of ours) at its top level."""
    defined: set[str] = set()
    imported: set[str] = set()

    def scan(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(n.id for t in targets for n in ast.walk(t)
                               if isinstance(n, ast.Name))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                ours = node.module.split(".")[0] in PACKAGES
                (imported if ours else defined).update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If | ast.Try):
                scan(node.body + node.orelse)
                for handler in getattr(node, "handlers", []):
                    scan(handler.body)

    scan(ast.parse(path.read_text()).body)
    return defined, imported - defined


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    """One import path per name: no module re-exports another's names (a facade, a shim), so
    `from efpsn.X import n` always names n's own module."""
    modules = {_module_name(f): f for f in _sources()}
    tables = {name: _top_level_names(path) for name, path in modules.items()}
    users = _sources() + sorted((ROOT / "tests").rglob("*.py")) + sorted(
        (ROOT / "benchmarks").rglob("*.py"))
    detours = []
    for path in users:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0
                    and node.module in tables):
                continue
            defined, passed_on = tables[node.module]
            detours += [f"{_rel(path)}: {a.name} from {node.module}" for a in node.names
                        if a.name in passed_on and a.name not in defined
                        and f"{node.module}.{a.name}" not in modules]
    assert detours == []


def test_no_hand_written_module_is_oversized() -> None:
    sizes = {_rel(f): len(f.read_text().splitlines()) for f in _sources()}
    assert {k: v for k, v in sizes.items() if v > MAX_LINES} == {}


def test_no_import_cycles_anywhere() -> None:
    """No circle of imports, counting every import: at module level, inside functions, and
    under `if TYPE_CHECKING:` (a circle hidden there is still two modules that need each
    other)."""
    modules = {_module_name(f): f for f in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imported in _imports(path):
            # "from a.b import c" names a.b.c (a module or an attribute): keep what is a module
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                deps.add(imported)
        graph[name] = deps
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_the_cycle_check_finds_a_circle_hidden_under_type_checking(tmp_path: Path) -> None:
    """The check above reads `if TYPE_CHECKING:` imports too (they are where circles hide)."""
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from agent.node import AgentNode\n")
    assert "agent.node" in _imports(module)
    assert "agent.node" not in _imports(module, top_level_only=True)


def test_phase_drivers_and_rules_never_touch_protobuf() -> None:
    """Only the agent's edges (the router, the client side, the round stream, the calls to the
    coordinator: bootstrap and the departure reports, and the assembly that registers the
    service) import the generated stubs; the phases, the exchange, the ledger and resume work
    on plain records."""
    edges = {"agent/router.py", "agent/peers.py", "agent/round_stream.py",
             "agent/bootstrap.py", "agent/departure/reports.py", "agent/assembly.py"}
    users = sorted(_rel(f) for f in _sources() if _rel(f).startswith("agent/")
                   and any(n.startswith("efpsn.wire.v1") for n in _imports(f)))
    assert set(users) <= edges, set(users) - edges
    for driver in ("agent/phases/phase_one.py", "agent/phases/secure_sum.py",
                   "agent/phases/phase_two.py", "agent/pipeline.py", "agent/exchange.py",
                   "efpsn/ledger.py", "agent/resume.py", "agent/membership.py"):
        assert not any("pb2" in n for n in _imports(ROOT / driver)), driver


def test_the_local_launcher_is_a_room_of_its_own() -> None:
    """`efpsn up` lives in efpsn/launch (it starts the services as processes); agent/ is the
    service only."""
    assert not (ROOT / "agent" / "launcher.py").exists()
    assert not (ROOT / "agent" / "summary.py").exists()
    for path in (ROOT / "efpsn" / "launch").glob("*.py"):
        assert not _top(_imports(path)) & {"agent", "coordinator"}, path


@pytest.mark.process
@pytest.mark.parametrize("code", [
    "import coordinator, coordinator.cli, coordinator.service, coordinator.registry",
    ("import runpy, sys\nsys.argv = ['coordinator', '--help']\n"
     "try:\n    runpy.run_module('coordinator', run_name='__main__')\nexcept SystemExit:\n    pass"),
])
def test_the_coordinator_never_imports_torch(code: str, tmp_path: Path) -> None:
    probe = code + "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in " \
                   "('torch', 'mlxtend', 'scipy', 'matplotlib')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_the_coordinator_requirements_are_a_subset_of_the_package_dependencies() -> None:
    import re
    import tomllib

    declared = {re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower()
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
                    "dependencies"]}
    wanted = {re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0].lower()
              for line in (ROOT / "coordinator" / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert wanted and wanted <= declared, wanted - declared
    assert "torch" not in wanted


@pytest.mark.process
def test_the_wheel_installs_the_three_packages_and_both_entry_points(tmp_path: Path) -> None:
    """Built and installed like a user would (not the editable checkout): the wheel holds
    efpsn, agent and coordinator, and both services answer --help from site-packages."""
    import shutil

    dist, venv, src = tmp_path / "dist", tmp_path / "venv", tmp_path / "src"
    # from a copy, so setuptools' build/ and egg-info never land in the checkout
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(dist), str(src)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = dist.glob("efpsn-*.whl")
    import zipfile

    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"efpsn", "agent", "coordinator"} <= tops, tops
    assert "tests" not in tops and "benchmarks" not in tops
    # --system-site-packages: the dependencies of this interpreter, but none of the checkout
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300, capture_output=True)
    for service in ("coordinator", "agent"):
        out = subprocess.run([python, "-m", service, "--help"], cwd=tmp_path, timeout=120,
                             capture_output=True, text=True, check=True)
        assert f"usage: python -m {service}" in out.stdout
        where = subprocess.run([python, "-c", f"import {service}; print({service}.__file__)"],
                               cwd=tmp_path, timeout=60, capture_output=True, text=True,
                               check=True).stdout.strip()
        assert where.startswith(str(venv)), where


def test_every_path_the_where_to_look_table_names_exists() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text.split("### Where to look", 1)[1].split("\n\n", 2)[1]
    roots = "efpsn|agent|coordinator|proto|tests|docs|benchmarks|scripts|deploy"
    named = set(re.findall(rf"`((?:{roots})/[\w/.]+\.\w+)`", table))
    assert len(named) > 20, named
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []
