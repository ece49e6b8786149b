"""How many times each process of a command parses the run parameters' text.

Runs an efpsn command (default: a small 5-agent `efpsn up`) with a sitecustomize on PYTHONPATH
that counts, in every Python process the command starts (launcher, coordinator, agents, the
fork server's children), the calls of each grammar's parse function, and prints one line per
process and the totals. Nothing of efpsn is changed: the counter is a profile hook that lives
in a temporary folder.

    .venv/bin/python benchmarks/count_parses.py                # efpsn up, 5 agents
    .venv/bin/python benchmarks/count_parses.py -- simulate --iterations 3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# (file suffix, function name) of each grammar's parse: the values' parse today, and the
# functions that parsed the same text before they became values (so one script measures both)
PARSERS = {
    "selection": [("efpsn/perturbation/selection.py", "parse_selection")],
    "refresh": [("efpsn/params/refresh_setting.py", "parse")],
    "schedule": [("efpsn/params/schedules.py", "make_schedule"), ("efpsn/params/values.py", "parse:Schedule")],
    "iterations": [("efpsn/params/checks.py", "parse_rounds"), ("efpsn/params/values.py", "parse:Rounds")],
    "batch_size": [("efpsn/params/checks.py", "parse_batch"),
                   ("efpsn/params/values.py", "parse:BatchSize")],
    "momentum": [("efpsn/params/checks.py", "parse_momentum"),
                 ("efpsn/params/values.py", "parse:Momentum")],
    "task": [("efpsn/params/schema.py", "check_task_spec"), ("efpsn/params/schema.py", "parse:TaskSpec")],
    "scale": [("efpsn/params/schema.py", "scale_divisor"), ("efpsn/params/schema.py", "parse:Scale")],
    "stop_every": [("efpsn/params/checks.py", "parse_stop_every"),
                   ("efpsn/params/values.py", "parse:StopEvery")],
}

_HOOK = '''
import json, os, sys, threading
_WANT = json.loads(os.environ["EFPSN_COUNT_PARSES_WANT"])
_OUT = os.environ["EFPSN_COUNT_PARSES_OUT"]
_counts = {}
_pid = [os.getpid()]

def _flag(frame):
    code = frame.f_code
    for flag, pairs in _WANT.items():
        for suffix, func in pairs:
            name, _, owner = func.partition(":")
            if code.co_name != name or not code.co_filename.endswith(suffix):
                continue
            if owner and getattr(frame.f_locals.get("cls"), "__name__", None) != owner:
                continue
            if any(isinstance(frame.f_locals.get(a), str) for a in ("spec", "text", "task", "scale")):
                return flag  # text parsed (a value handed on as it is is not a parse)
    return None

def _profile(frame, event, arg):
    if event == "call":
        flag = _flag(frame)
        if flag is not None:
            if os.getpid() != _pid[0]:  # a forked child counts its own calls
                _pid[0] = os.getpid()
                _counts.clear()
            _counts[flag] = _counts.get(flag, 0) + 1
            with open(os.path.join(_OUT, f"{os.getpid()}.json"), "w") as fh:
                json.dump({"argv": sys.argv, "counts": _counts}, fh)

sys.setprofile(_profile)
threading.setprofile(_profile)
'''

DEFAULT = ["up", "--agents", "5", "--iterations", "3", "--key-bits", "2048", "--quiet"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="*", help="efpsn's arguments (after --)")
    args = parser.parse_args()
    command = args.command or DEFAULT
    with tempfile.TemporaryDirectory() as hook, tempfile.TemporaryDirectory() as out:
        Path(hook, "sitecustomize.py").write_text(_HOOK)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [hook, *filter(None, [os.environ.get("PYTHONPATH")])]),
            "EFPSN_COUNT_PARSES_WANT": json.dumps(PARSERS), "EFPSN_COUNT_PARSES_OUT": out}
        done = subprocess.run([sys.executable, "-m", "efpsn", *command], env=env, check=False,
                              stdout=subprocess.DEVNULL)
        totals: collections.Counter[str] = collections.Counter()
        for path in sorted(Path(out).glob("*.json")):
            record = json.loads(path.read_text())
            if not record["counts"]:
                continue
            totals.update(record["counts"])
            who = " ".join(record["argv"])[:60]
            print(f"{path.stem:>8} {who:<60} {record['counts']}")
        print(f"efpsn {' '.join(command)} (exit {done.returncode}): {dict(totals)}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
