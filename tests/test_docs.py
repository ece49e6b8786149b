"""The README and the user guides under docs/ as a user meets them: every command block runs as
written, every link leads somewhere, and no page cites an issue number or a load average.

The pages: README.md and docs/*.md but the design (ARCHITECTURE.md), the lab notebook
(RESULTS.md, which keeps its figures and loads) and the mutation notes (MUTATION.md). Blocks:
```bash (or ```sh) runs with `bash -e` and ```python with this interpreter, in one scratch
folder per page, in the page's order (a later block may use what an earlier one made), with
`efpsn` on the PATH. A block opts out only with a visible line just above it that starts with
`*Not run by tests/test_docs.py:` and says why (one command per machine, a Docker engine, the
whole suite); the README's own-data walk-through (`<!-- walkthrough: ... -->`) is run by
tests/test_readme_walkthrough.py on the folder it makes. ```text, ```json and bare fences are
not commands."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_GUIDES = {"ARCHITECTURE.md", "RESULTS.md", "MUTATION.md"}
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md")
                                     if p.name not in NOT_GUIDES)]
SKIP = "*Not run by tests/test_docs.py:"
# pages written on other branches and linked already; drop a name here once its page is in the
# tree (none now)
PENDING: set[str] = set()
# what a page's blocks must print (beyond exiting 0), so that a block that runs but does
# nothing cannot pass
EXPECTED = {
    "operating.md": [r"local run in R: .*; [1-4] of 4 agents answer\nagent1: ",
                     r"converged: \|\|x_bar - x\*\|\|", r"wrote R/training.png",
                     r"efpsn up: to resume from the last checkpoints in R2, run the same command",
                     r"efpsn up: R2 holds a stopped run",
                     r"efpsn up: resuming from round \d+"],
    "hosts.md": [r"DNS:agent2", r"IP:192\.0\.2\.12"],
    "privacy.md": [r"epsilon = [\d.]+, delta = 1e-05", r"gamma needed for epsilon <= 0\.5"],
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    kind: str  # bash | python
    code: str
    skipped: str | None  # why not run here (None: run)


def blocks(page: Path) -> list[Block]:
    """The page's command blocks, each with the reason it is not run here (if it is not)."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)\s*", lines[i])
        if not fence:
            i += 1
            continue
        end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        kind = {"bash": "bash", "sh": "bash", "python": "python"}.get(fence.group(1))
        if kind is not None:
            above = [line for line in lines[max(0, i - 8):i] if line.strip()]
            paragraph: list[str] = []
            for line in reversed(above):
                if line.startswith("<!--"):
                    break
                paragraph.insert(0, line)
                if line.startswith("*"):
                    break
            said = " ".join(paragraph)
            walkthrough = bool(above) and above[-1].startswith("<!-- walkthrough:")
            skipped = ("run by tests/test_readme_walkthrough.py" if walkthrough
                       else said if said.startswith(SKIP) else None)
            out.append(Block(page, i + 1, kind, "\n".join(lines[i + 1:end]) + "\n", skipped))
        i = end + 1
    return out


def _run(block: Block, folder: Path, env: dict[str, str]) -> str:
    argv = (["bash", "-e", "-c", block.code] if block.kind == "bash"
            else [sys.executable, "-c", block.code])
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{block.page.name}:{block.line} timed out:\n{out[-3000:]}") \
            from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the block left in the background
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"{block.page.name}:{block.line} exited {proc.returncode}:\n" \
                                 f"{out[-3000:]}"
    return out


@pytest.mark.process
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_block_runs_as_written(page: Path, tmp_path: Path) -> None:
    found = blocks(page)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GRPC_VERBOSITY": "NONE"}
    outputs = [_run(b, tmp_path, env) for b in found if b.skipped is None]
    for pattern in EXPECTED.get(page.name, []):
        assert any(re.search(pattern, out) for out in outputs), (pattern, outputs)
    if page.name in EXPECTED:
        assert outputs, f"{page.name} has no command block that runs"


def test_every_page_says_why_a_block_is_not_run() -> None:
    for page in PAGES:
        for b in blocks(page):
            if b.skipped is not None and b.skipped.startswith(SKIP):
                assert len(b.skipped) > len(SKIP) + 20, (page.name, b.line, b.skipped)
    readme = blocks(ROOT / "README.md")
    assert [b.skipped for b in readme if b.kind == "python"] == [
        "run by tests/test_readme_walkthrough.py"]
    assert "tests/test_readme_walkthrough.py" in (ROOT / "README.md").read_text()
    # the guides a user follows run their own commands: most of their blocks run here
    ran = [b for page in PAGES if page.name in EXPECTED for b in blocks(page)
           if b.skipped is None]
    assert len(ran) >= 5


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def test_every_link_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = str(file.relative_to(ROOT)) if file.is_relative_to(ROOT) else str(file)
            if where in PENDING and not file.exists():
                continue
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_front_door_is_short_and_no_page_cites_an_issue_or_a_load() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"\bissues? #?\d", text, re.IGNORECASE), page.name
        assert "load average" not in text.lower(), page.name
    guides = {p.name for p in PAGES}
    assert {"hosts.md", "containers.md", "privacy.md", "operating.md"} <= guides
