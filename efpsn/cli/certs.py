"""`efpsn certs`: certificates for mutual TLS, from signing requests or for one operator.

    efpsn certs init-ca --out CA                         the CA (operator)
    efpsn certs request --name agent1 --out DIR          a key and a request (on the party's host)
    efpsn certs sign --ca CA --csr agent1.csr --out DIR  the certificate (on the CA's host)
    efpsn certs --out DIR --names coordinator,agent1     every key in one folder (one operator)

Nothing here imports grpc or torch at module level, so building the parser stays quick.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_DAYS = 365
KEY_TYPES = ("ec", "rsa")

# The one-operator form's flags, kept apart from the subcommands' (argparse would let a
# subcommand's defaults overwrite them).
LEGACY = ("legacy_out", "legacy_names", "legacy_ip", "legacy_dns", "legacy_days",
          "legacy_key_type", "legacy_force")


def _one_operator(args: argparse.Namespace) -> int:
    from efpsn.wire.tls import generate_certificates

    if not args.legacy_out or not args.legacy_names:
        raise ValueError("give a step (init-ca, request or sign; see `efpsn certs --help`), or "
                         "--out DIR --names NAME,... to make every node's key in one folder")
    names = [n.strip() for n in args.legacy_names.split(",") if n.strip()]
    written = generate_certificates(
        args.legacy_out, names, ips=["127.0.0.1", *(args.legacy_ip or [])],
        dns=args.legacy_dns or [], days=args.legacy_days or DEFAULT_DAYS,
        key_type=args.legacy_key_type or "ec", overwrite=args.legacy_force,
    )
    out = Path(args.legacy_out)
    print(f"CA: {out / 'ca.pem'} (its key {out / 'ca.key'} signs new certificates: keep it "
          "offline)")
    for name, path in written.items():
        print(f"{name}: {path} + {out / (name + '.key')} (mode 0600)")
    return 0


def _no_legacy_flags(args: argparse.Namespace) -> None:
    given = [name for name in LEGACY if getattr(args, name) not in (None, False)]
    if given:
        flags = ", ".join("--" + name.removeprefix("legacy_").replace("_", "-") for name in given)
        raise ValueError(f"{flags} before `{args.certs_step}` belong to the one-operator form "
                         f"`efpsn certs --out DIR --names ...`; give the step's own flags after "
                         "its name")


def _init_ca(args: argparse.Namespace) -> int:
    from efpsn.wire.csr import init_ca
    from efpsn.wire.tls import CA_KEY

    _no_legacy_flags(args)
    cert = init_ca(args.out, days=args.days, key_type=args.key_type, overwrite=args.force)
    print(f"CA certificate: {cert} (give it to every party)")
    print(f"CA key: {cert.with_name(CA_KEY)} (mode 0600: it signs certificates; keep it on this "
          "host, offline if you can)")
    return 0


def _request(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from efpsn.wire.csr import describe_key, key_fingerprint, request_certificate

    _no_legacy_flags(args)
    key_path, csr_path = request_certificate(
        args.out, args.name, ips=_items(args.ip), dns=_items(args.dns), key_type=args.key_type,
        overwrite=args.force)
    public = load_pem_private_key(key_path.read_bytes(), password=None).public_key()
    print(f"key: {key_path} (mode 0600: it stays in this folder, never send it)")
    print(f"request: {csr_path} (public: send it to the CA)")
    print(f"  {describe_key(public)}, sha256 {key_fingerprint(public)} (the CA prints the same "
          "when it signs: compare them over another channel)")
    print(f"then put the CA's {args.name}.pem and ca.pem into {args.out}: --tls-dir {args.out}")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from efpsn.wire.csr import sign_request

    _no_legacy_flags(args)
    signed = sign_request(args.ca, args.csr, args.out, days=args.days, overwrite=args.force,
                          replace=args.replace)
    print("\n".join(signed.lines()))
    return 0


def _items(values: list[str] | None) -> list[str]:
    return [v.strip() for raw in values or [] for v in raw.split(",") if v.strip()]


def _step(steps: argparse._SubParsersAction, step: str, handler: Any, /, *, help: str,
          force: str, key_type: bool, **flags: dict[str, Any]) -> None:
    """A step's parser: its own flags (name -> add_argument keywords), then --key-type (for
    the steps that make a key) and --force."""
    p = steps.add_parser(step, help=help)
    for flag, options in flags.items():
        p.add_argument("--" + flag.replace("_", "-"), **options)
    if key_type:
        p.add_argument("--key-type", choices=KEY_TYPES, default="ec",
                       help="EC P-256 (default) or RSA 3072")
    p.add_argument("--force", action="store_true", help=force)
    p.set_defaults(handler=handler)


DESCRIPTION = (
    "Certificates for mutual TLS. Parties on separate hosts: the operator runs `init-ca`, each "
    "party runs `request` on its own host (its key never leaves that folder) and sends the .csr, "
    "the operator runs `sign` and sends back NAME.pem and ca.pem. One operator for every node: "
    "`efpsn certs --out DIR --names ...` (every key in DIR).")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `efpsn certs` (its three steps and the one-operator form) to the `efpsn` parser."""
    certs = sub.add_parser("certs", description=DESCRIPTION, help="certificates for mutual TLS: "
                           "CA, party-side keys and requests, signing")
    one = certs.add_argument_group("one operator, every key in one folder (no step given)")
    one.add_argument("--out", dest="legacy_out", metavar="DIR", default=None,
                     help="folder for ca.pem, NAME.pem, NAME.key")
    one.add_argument("--names", dest="legacy_names", metavar="NAMES", default=None,
                     help="comma-separated node names, e.g. coordinator,agent1,agent2")
    one.add_argument("--ip", dest="legacy_ip", metavar="IP", action="append", default=None,
                     help="IP subject-alternative name: IP (every certificate) or NAME=IP "
                          "(repeatable; 127.0.0.1 is always included)")
    one.add_argument("--dns", dest="legacy_dns", metavar="DNS", action="append", default=None,
                     help="extra DNS subject-alternative name: DNS or NAME=DNS (repeatable)")
    one.add_argument("--days", dest="legacy_days", metavar="DAYS", type=int, default=None,
                     help=f"validity (default {DEFAULT_DAYS})")
    one.add_argument("--key-type", dest="legacy_key_type", choices=KEY_TYPES, default=None,
                     help="EC P-256 (default) or RSA 3072")
    one.add_argument("--force", dest="legacy_force", action="store_true",
                     help="overwrite existing NAME files")
    certs.set_defaults(handler=_one_operator, numeric=False, certs_step=None)
    steps = certs.add_subparsers(dest="certs_step", metavar="STEP")

    _step(steps, "init-ca", _init_ca, help="a new CA: OUT/ca.pem and OUT/ca.key (0600)",
          force="replace an existing CA", key_type=True,
          out={"required": True, "help": "the CA's folder (made 0700)"},
          days={"type": int, "default": DEFAULT_DAYS, "help": f"validity (default {DEFAULT_DAYS})"})
    _step(steps, "request", _request,
          help="on the party's host: OUT/NAME.key (0600) and OUT/NAME.csr to send to the CA",
          force="overwrite NAME.key and NAME.csr", key_type=True,
          name={"required": True, "help": "the node's name, e.g. agent1"},
          out={"required": True, "help": "the party's own folder (made 0700)"},
          ip={"action": "append", "default": None,
              "help": "an IP address the node is dialled at (repeatable or comma-separated)"},
          dns={"action": "append", "default": None,
               "help": "an extra fully qualified DNS name of the node (repeatable)"})
    _step(steps, "sign", _sign,
          help="on the CA's host: check a request, write OUT/NAME.pem and OUT/ca.pem",
          force="overwrite NAME.pem and ca.pem", key_type=False,
          ca={"required": True, "help": "the CA's folder (ca.pem, ca.key)"},
          csr={"required": True, "help": "the party's NAME.csr"},
          out={"required": True, "help": "folder for NAME.pem and ca.pem"},
          days={"type": int, "default": DEFAULT_DAYS,
                "help": f"validity (default {DEFAULT_DAYS}, never beyond the CA's)"},
          replace={"action": "store_true",
                   "help": "sign although NAME already has a certificate for another key"})
