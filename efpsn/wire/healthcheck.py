"""`python -m efpsn.wire.healthcheck [--tls-dir DIR --tls-name NAME] HOST:PORT`: exit 0 when the
gRPC server there reports SERVING.

A container healthcheck for the coordinator and the agents: it asks the standard health service
(grpc.health.v1, overall status, service "") that both run, and imports nothing heavy (no torch),
so it is cheap to run every few seconds.

With --tls-dir the check speaks mutual TLS as a node of the run: it presents NAME.pem/NAME.key
from DIR, trusts DIR/ca.pem, and requires the server's certificate to carry --server-name
(default NAME: in a container, NAME is the node's own name and it checks itself; any party's
own certificate checks another node with --server-name that node). Without it, plaintext
(--insecure servers).

Exit codes: 0 SERVING, 1 anything else (not serving, unreachable, TLS refused, timed out),
2 usage error (bad address, unreadable TLS files).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _channel(address: str, tls_dir: str | None, tls_name: str | None,
             server_name: str | None):  # -> grpc.Channel
    import grpc

    if not tls_dir:
        return grpc.insecure_channel(address)
    folder = Path(tls_dir)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(folder / "ca.pem").read_bytes(),
        private_key=(folder / f"{tls_name}.key").read_bytes(),
        certificate_chain=(folder / f"{tls_name}.pem").read_bytes(),
    )
    expected = server_name or tls_name
    options = [("grpc.ssl_target_name_override", expected)] if expected else []
    return grpc.secure_channel(address, credentials, options=options)


def check(address: str, *, timeout: float = 5.0, service: str = "",
          tls_dir: str | None = None, tls_name: str | None = None,
          server_name: str | None = None) -> tuple[bool, str]:
    """(serving, status text) of the health service at `address` (HOST:PORT); the server's
    certificate must carry `server_name` (default `tls_name`, the caller's own)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with _channel(address, tls_dir, tls_name, server_name) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            return False, f"{code.name if code else 'ERROR'}: {details or ''}".strip()
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m efpsn.wire.healthcheck",
        description="Exit 0 when the gRPC health service at HOST:PORT reports SERVING.",
    )
    parser.add_argument("address", help="HOST:PORT of a coordinator or agent")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--service", default="", help="service name (default: overall status)")
    parser.add_argument("--tls-dir", default=None,
                        help="mutual TLS: folder with ca.pem, NAME.pem and NAME.key")
    parser.add_argument("--tls-name", default=None,
                        help="NAME: the certificate to present (required with --tls-dir)")
    parser.add_argument("--server-name", default=None,
                        help="the name the server's certificate must carry (default: NAME, "
                             "a node checking itself)")
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    args = parser.parse_args(argv)
    # gRPC core logs a failed handshake to stderr itself; the one-line status below says it all.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    host, sep, port = args.address.rpartition(":")
    if not sep or not host or not port.isdigit():
        parser.error(f"expected HOST:PORT, got {args.address!r}")
    if bool(args.tls_dir) != bool(args.tls_name):
        parser.error("--tls-dir and --tls-name go together")
    try:
        serving, status = check(args.address, timeout=args.timeout, service=args.service,
                                tls_dir=args.tls_dir, tls_name=args.tls_name,
                                server_name=args.server_name)
    except OSError as exc:
        parser.error(f"cannot read the TLS files: {exc}")
    if not args.quiet:
        print(f"{args.address}: {status}", file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
