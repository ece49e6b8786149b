"""What the fork server loads before it forks agents, derived from the agent's own imports.

The agent package's modules, every module they import (at the top of a module, or inside the
agent's functions: those run in every agent too), and so on through efpsn and coordinator's
top-level imports, read from the source without importing anything; less every module whose
own imports reach grpc (gRPC must start after the fork: agent/forkserver.py). Third-party and
standard modules are kept by the name they are imported by (numpy, torch, phe, ...).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["preload_modules"]

_ROOT = Path(__file__).resolve().parents[1]
_FIRST_PARTY = ("efpsn", "agent", "coordinator")
_NOT_PRELOADED = ("agent.forkserver", "agent.preload", "agent.__main__")


def preload_modules() -> tuple[str, ...]:
    """The modules every agent needs and none of which imports grpc, in a stable order."""
    seeds = sorted(f"agent.{p.stem}" for p in (_ROOT / "agent").glob("*.py")
                   if f"agent.{p.stem}" not in _NOT_PRELOADED and p.stem != "__init__")
    needed = _closure(tuple(seeds), lazy_in="agent.")
    return tuple(sorted(m for m in needed
                        if m not in _NOT_PRELOADED and not _reaches_grpc(m)))


def _path(module: str) -> Path | None:
    base = _ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _imports(module: str, lazy: bool) -> frozenset[str]:
    """The modules `module`'s source imports (not under `if TYPE_CHECKING`; inside functions
    only when `lazy`)."""
    path = _path(module)
    if path is None:
        return frozenset()
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names
                             if _path(f"{node.module}.{a.name}") is not None)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if lazy:
                    visit(node.body)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        visit(inner)

    visit(ast.parse(path.read_text()).body)
    return frozenset(found)


@functools.cache
def _closure(seeds: tuple[str, ...], lazy_in: str | None = None) -> frozenset[str]:
    seen: set[str] = set()
    todo = list(seeds)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module.split(".")[0] in _FIRST_PARTY:
            parts = module.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parents run first
            lazy = lazy_in is not None and module.startswith(lazy_in)
            todo += sorted(_imports(module, lazy))
    return frozenset(seen)


def _reaches_grpc(module: str) -> bool:
    return any(m == "grpc" or m.startswith(("grpc.", "grpc_")) for m in _closure((module,)))
