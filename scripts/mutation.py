"""Mutation testing of one pure module against its own test files (scripts/mutation.sh runs it).

For MODULE (a path like efpsn/crypto/encoding.py, a dotted name, or `all` for every mapped module):

1. copy the tree git knows (tracked and untracked-but-not-ignored files, as they are now) into
   a scratch folder outside the repository, removed at the end whatever happens;
2. list the mutants: mutmut's own, inside functions and methods, and the same operators where
   mutmut does not apply them (the assignments that run at import: constants, caps, tables,
   class fields; the bodies of decorated functions such as @property), which this script
   applies as real edits of the copied file;
3. take an evenly spaced sample of them in source order (all when there are fewer);
4. run mutmut on its sampled mutants (in the copy: it writes mutants/ there) and the module's
   test files against each real-edit mutant, in a fresh pytest process;
5. print the table row and every survivor as a diff.

The module -> test files mapping lives in pyproject.toml, [tool.efpsn.mutation]; mutmut's own
configuration in [tool.mutmut] (this script only adds only_mutate and the test selection).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
SKIPPED_TARGETS = {"__all__"}  # re-export lists: not behaviour


@dataclasses.dataclass
class Mutant:
    """One mutant: mutmut's (by name) or a real edit of the module (its whole source)."""

    line: int
    name: str
    source: str | None = None  # the whole mutated module, for a real-edit mutant
    diff: str = ""
    status: str = "not checked"


def mapping() -> dict[str, list[str]]:
    """module path -> its test files, from pyproject.toml."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(data["tool"]["efpsn"]["mutation"])


def resolve(module: str, known: dict[str, list[str]]) -> str:
    """'efpsn/wire/limits.py', 'efpsn.wire.limits' or 'limits' -> the mapped path."""
    candidates = [module, module.replace(".", "/") + ".py"]
    candidates += [path for path in known if Path(path).stem == module]
    for candidate in candidates:
        if candidate in known:
            return candidate
    raise SystemExit(f"mutation: no test files mapped for {module!r}; known modules: "
                     f"{', '.join(known)} (add it to [tool.efpsn.mutation] in pyproject.toml)")


def copy_tree(destination: Path) -> None:
    """The files git tracks plus the untracked ones it does not ignore, as in the work tree."""
    listing = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                             check=True, capture_output=True).stdout.decode()
    for relative in filter(None, listing.split("\0")):
        source = ROOT / relative
        if source.is_file():
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def configure_mutmut(tree: Path, module: str, tests: list[str]) -> None:
    """The copy's pyproject.toml: the repository's [tool.mutmut] plus this module's selection."""
    pyproject = tree / "pyproject.toml"
    base = dict(tomllib.loads(pyproject.read_text())["tool"].get("mutmut", {}))
    base.update(only_mutate=[module], pytest_add_cli_args_test_selection=tests)
    kept, skipping = [], False
    for line in pyproject.read_text().splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[tool.mutmut]"
        if not skipping:
            kept.append(line)
    kept += ["", "[tool.mutmut]"] + [f"{key} = {toml_value(value)}" for key, value in base.items()]
    pyproject.write_text("\n".join(kept) + "\n")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"[tool.mutmut] value {value!r} is not a string, number, bool or list")


def function_mutants(tree: Path, module: str) -> list[Mutant]:
    """mutmut's mutants of `module`, each at the first line of its function."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    source = (tree / module).read_text()
    names = mutate_file_contents(module, source).mutant_names
    wrapper = MetadataWrapper(cst.parse_module(source))
    positions = wrapper.resolve(PositionProvider)
    first_line = {}
    for statement in wrapper.module.body:
        methods = [statement] if isinstance(statement, cst.FunctionDef) else []
        prefix = "x_"
        if isinstance(statement, cst.ClassDef):
            methods = [s for s in statement.body.body if isinstance(s, cst.FunctionDef)]
            prefix = f"xǁ{statement.name.value}ǁ"
        for method in methods:
            first_line[prefix + method.name.value] = positions[method].start.line
    return [Mutant(line=first_line[name.partition("__mutmut_")[0]],
                   name=get_mutant_name(Path(module), name)) for name in names]


def module_level_mutants(tree: Path, module: str) -> list[Mutant]:
    """mutmut's operators where mutmut does not apply them, each mutant a whole edited module:
    the assignments that run at import (module and class bodies; not docstrings, imports or
    __all__) and the bodies of decorated functions mutmut skips (@property and the like)."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import NEVER_MUTATE_FUNCTION_CALLS
    from mutmut.mutation.mutators import mutation_operators

    source = (tree / module).read_text()
    wrapper = MetadataWrapper(cst.parse_module(source))
    positions = wrapper.resolve(PositionProvider)
    lines = source.splitlines()

    def skipped_by_mutmut(function: cst.FunctionDef) -> bool:
        names = [d.decorator.value for d in function.decorators
                 if isinstance(d.decorator, cst.Name)]
        return bool(function.decorators) and names not in (["staticmethod"], ["classmethod"])

    def targets(body: object) -> list[cst.CSTNode]:
        out = []
        for statement in body:
            if isinstance(statement, cst.ClassDef):
                out += targets(statement.body.body)
            elif isinstance(statement, cst.FunctionDef) and skipped_by_mutmut(statement):
                out.append(statement.body)
            elif isinstance(statement, cst.SimpleStatementLine):
                small = statement.body[0]
                assigned = ([a.target for a in small.targets] if isinstance(small, cst.Assign)
                            else [small.target] if isinstance(small, cst.AnnAssign) else [])
                if assigned and not any(isinstance(a, cst.Name) and a.value in SKIPPED_TARGETS
                                        for a in assigned):
                    out.append(statement)
        return out

    def walk(node: cst.CSTNode) -> list[cst.CSTNode]:
        if isinstance(node, cst.Annotation) or (
                isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
                and node.func.value in NEVER_MUTATE_FUNCTION_CALLS):
            return []
        return [node] + [n for child in node.children for n in walk(child)]

    out = []
    for target in targets(wrapper.module.body):
        for node in walk(target):
            line = positions[node].start.line
            if "pragma: no mutate" in lines[line - 1]:
                continue
            for kind, operator in mutation_operators:
                if not isinstance(node, kind):
                    continue
                for mutated in operator(node):
                    code = wrapper.module.deep_replace(node, mutated).code
                    out.append(Mutant(line=line, name=f"{module}:{line}#{len(out) + 1}",
                                      source=code, diff=diff_lines(source, code, module)))
    return out


def diff_lines(before: str, after: str, module: str) -> str:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), module, module,
                                n=0, lineterm="")
    return "\n".join(line for line in diff if not line.startswith(("---", "+++")))


def evenly_spaced(mutants: list[Mutant], size: int | None) -> list[Mutant]:
    ordered = sorted(mutants, key=lambda m: m.line)  # stable: mutmut's order within a function
    if size is None or len(ordered) <= size:
        return ordered
    return [ordered[i * len(ordered) // size] for i in range(size)]


def run_mutmut(tree: Path, module: str, sample: list[Mutant], jobs: int, log: Path) -> None:
    """mutmut run on the sampled names; statuses and diffs read back from mutants/."""
    import json

    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    names = [m.name for m in sample if m.source is None]
    if not names:
        return
    with log.open("w") as out, subprocess.Popen(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names],
            cwd=tree, stdout=out, stderr=subprocess.STDOUT, start_new_session=True) as mutmut:
        try:
            mutmut.wait()
        finally:  # interrupted: end mutmut and the workers it forked, then clean up
            if mutmut.poll() is None:
                os.killpg(mutmut.pid, signal.SIGKILL)
    meta = tree / "mutants" / (module + ".meta")
    codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    if any(codes.get(name) is None for name in names):
        tail = log.read_text(errors="replace").replace("\r", "\n").splitlines()[-40:]
        raise SystemExit("mutation: mutmut left mutants unchecked; its output ends:\n"
                         + "\n".join(tail))
    cwd = Path.cwd()
    os.chdir(tree)  # mutmut reads its own files relative to the working directory
    try:
        for mutant in sample:
            if mutant.source is None:
                mutant.status = status_by_exit_code[codes.get(mutant.name)]
                if mutant.status not in KILLED:
                    diff = get_diff_for_mutant(mutant.name, path=module).splitlines()[2:]
                    mutant.line += changed_line(diff) - 1
                    mutant.diff = "\n".join(line for line in diff if line[:1] in "-+")
    finally:
        os.chdir(cwd)


def changed_line(diff: list[str]) -> int:
    """The 1-based line, within the function, of a unified diff's first change."""
    hunk = re.match(r"@@ -(\d+)", diff[0]) if diff else None
    if hunk is None:
        return 1
    line = int(hunk.group(1))
    for text in diff[1:]:
        if text[:1] in "-+":
            return line
        line += 1
    return line


def run_real_edits(tree: Path, module: str, tests: list[str], sample: list[Mutant],
                   jobs: int) -> None:
    """Each real-edit mutant: the edited module in its own copy, the module's tests in a fresh
    pytest process (-x); killed when they fail, timeout after 10 times a clean run."""
    edits = [m for m in sample if m.source is not None]
    if not edits:
        return
    copies = [tree / f".edit{w}" for w in range(min(jobs, len(edits)))]
    for copy in copies:
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("mutants", ".edit*"))
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "--hypothesis-seed=0", *tests]

    def pytest(copy: Path, timeout: float | None) -> int | None:
        env = {**os.environ, "PYTHONPATH": str(copy)}
        try:
            return subprocess.run(command, cwd=copy, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout,
                                  check=False).returncode
        except subprocess.TimeoutExpired:
            return None

    started = time.monotonic()
    if pytest(copies[0], None) != 0:
        raise SystemExit(f"mutation: {' '.join(tests)} fail on the unmutated tree")
    timeout = max(60.0, 10 * (time.monotonic() - started))
    original = (tree / module).read_text()

    def check(work: tuple[Path, list[Mutant]]) -> None:
        copy, mine = work
        for mutant in mine:
            (copy / module).write_text(mutant.source or "")
            code = pytest(copy, timeout)
            mutant.status = ("timeout" if code is None else "survived" if code == 0
                             else "no tests" if code == 5 else "killed")
        (copy / module).write_text(original)

    with ThreadPoolExecutor(len(copies)) as pool:
        list(pool.map(check, [(copy, edits[w::len(copies)]) for w, copy in enumerate(copies)]))


def mutation_test(module: str, tests: list[str], *, size: int | None, jobs: int,
                  log_dir: Path) -> tuple[str, list[Mutant]]:
    """Score one module: its table row and its surviving mutants."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="efpsn-mutation-") as scratch:
        tree = Path(scratch) / "tree"
        copy_tree(tree)
        configure_mutmut(tree, module, tests)
        cwd = Path.cwd()
        os.chdir(tree)  # mutmut's generator reads [tool.mutmut] from the working directory
        try:
            inside = function_mutants(tree, module)
        finally:
            os.chdir(cwd)
        at_import = module_level_mutants(tree, module)
        sample = evenly_spaced(inside + at_import, size)
        run_mutmut(tree, module, sample, jobs, log_dir / (module.replace("/", ".") + ".log"))
        run_real_edits(tree, module, tests, sample, jobs)
    killed = sum(m.status in KILLED for m in sample)
    edits = sum(m.source is not None for m in sample)
    minutes = (time.monotonic() - started) / 60
    row = (f"| {module} | {len(inside)} + {len(at_import)} | {len(sample) - edits} + {edits} | "
           f"{killed} | {len(sample) - killed} | {100 * killed / max(1, len(sample)):.0f}% | "
           f"{minutes:.1f} min |")
    survivors = [m for m in sample if m.status not in KILLED]
    return row, survivors


HEADER = ("| module | mutants (in functions + at import) | sampled | killed | survived | score "
          "| wall time |\n|---|---|---|---|---|---|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="a mapped module (efpsn/crypto/encoding.py, efpsn.crypto.encoding, "
                        "encoding) or 'all'")
    parser.add_argument("--sample", type=int, default=60,
                        help="how many evenly spaced mutants per module (default 60)")
    parser.add_argument("--all-mutants", action="store_true", help="every mutant, no sample")
    parser.add_argument("--jobs", type=int, default=2, help="parallel test processes (default 2)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("mutation: terminated"))  # cleans up
    if args.sample < 1:
        parser.error("--sample must be >= 1")
    known = mapping()
    modules = list(known) if args.module == "all" else [resolve(args.module, known)]
    size = None if args.all_mutants else args.sample
    with tempfile.TemporaryDirectory(prefix="efpsn-mutation-logs-") as logs:
        rows, survivors = [], []
        for module in modules:
            print(f"mutation: {module} against {' '.join(known[module])} ...", flush=True)
            row, left = mutation_test(module, known[module], size=size, jobs=args.jobs,
                                            log_dir=Path(logs))
            rows.append(row)
            survivors += left
            print(row, flush=True)
    print()
    print(HEADER)
    print("\n".join(rows))
    print(f"\nsurvivors ({len(survivors)}):")
    for mutant in survivors:
        print(f"\n{mutant.name} ({mutant.status}, line {mutant.line})\n{mutant.diff}")


if __name__ == "__main__":
    main()
