"""Certificates from signing requests: each party makes its own key, the CA signs without it.

The three steps, each on its own host:

1. `init_ca(CA)`: the operator's CA, CA/ca.pem and CA/ca.key (0600, in a 0700 folder).
2. `request_certificate(DIR, NAME)`: on the party's host, DIR/NAME.key (0600, never leaves
   DIR) and DIR/NAME.csr, a PKCS#10 request for CN=NAME and DNS:NAME (plus the extra DNS and
   IP names the party is dialled at), signed with that key.
3. `sign_request(CA, NAME.csr, OUT)`: on the CA's host, OUT/NAME.pem and OUT/ca.pem. The
   certificate is the one `generate_certificates` would issue for NAME (same subject, SANs and
   usages), so the agents' and the coordinator's name checks are unchanged. The party puts
   NAME.pem and ca.pem next to its key: DIR is then a `--tls-dir` for NAME.

Signing refuses a request whose signature does not verify, whose name is not a node name,
that asks for CA rights or for other kinds of names, or that carries a weak key. The CA keeps
a ledger of what it signed (CA/issued.jsonl, public facts only), so that no name, in any
letter case, ever appears in the certificates of two different nodes, and a node's name is
not signed for a second key unless the operator says `replace`.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtensionOID, NameOID

from efpsn.wire.tls import (
    CA_CERT,
    CA_KEY,
    DEFAULT_DAYS,
    TlsError,
    cert_pem,
    check_days,
    check_node_name,
    is_ip,
    key_pem,
    new_ca,
    new_key,
    node_certificate,
    private_folder,
    public_der,
    write_private,
    write_public,
)

LEDGER = "issued.jsonl"
CSR_SUFFIX = ".csr"
EC_CURVES = ("secp256r1", "secp384r1")
MIN_RSA_BITS = 2048
DNS_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
# Extensions a request may carry: what they ask for is checked; the certificate's own
# extensions are always the node certificate's, never copied from the request.
READ_EXTENSIONS = {ExtensionOID.SUBJECT_ALTERNATIVE_NAME, ExtensionOID.BASIC_CONSTRAINTS,
                   ExtensionOID.KEY_USAGE}


def key_fingerprint(public_key: Any) -> str:
    """sha256 of the public key (SubjectPublicKeyInfo, DER), to compare over another channel."""
    return hashlib.sha256(public_der(public_key)).hexdigest()


def describe_key(public_key: Any) -> str:
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return f"EC {public_key.curve.name}"
    if isinstance(public_key, rsa.RSAPublicKey):
        return f"RSA {public_key.key_size}"
    return type(public_key).__name__


# ------------------------------------------------------------------------------- CA


def init_ca(out: str | os.PathLike[str], *, days: int = DEFAULT_DAYS, key_type: str = "ec",
            overwrite: bool = False) -> Path:
    """OUT/ca.pem and OUT/ca.key (0600) of a new CA; returns the certificate's path."""
    folder = Path(out)
    check_days(days)
    existing = [str(folder / n) for n in (CA_CERT, CA_KEY, LEDGER) if (folder / n).exists()]
    if existing and not overwrite:
        raise TlsError(f"refusing to overwrite {', '.join(existing)} (use --force: every "
                       "certificate of the old CA stops being trusted with it)")
    cert, key = new_ca(key_type, days=days)
    private_folder(folder)
    (folder / LEDGER).unlink(missing_ok=True)
    write_private(folder / CA_KEY, key_pem(key))
    write_public(folder / CA_CERT, cert_pem(cert))
    return folder / CA_CERT


def load_ca(folder: Path) -> tuple[x509.Certificate, Any]:
    """FOLDER/ca.pem and FOLDER/ca.key, checked to belong together."""
    try:
        cert = x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((folder / CA_KEY).read_bytes(), password=None)
    except OSError as exc:
        raise TlsError(f"cannot read the CA in {folder}: {exc.strerror or exc} (make one with "
                       "`efpsn certs init-ca`)") from None
    except (ValueError, TypeError):
        raise TlsError(f"{folder / CA_CERT} or {folder / CA_KEY} is not an unencrypted PEM "
                       "certificate and key") from None
    if public_der(key.public_key()) != public_der(cert.public_key()):
        raise TlsError(f"{folder / CA_KEY} is not the key of {folder / CA_CERT}")
    return cert, key


# ------------------------------------------------------------------------------- party


def _check_sans(name: str, dns: list[str], ips: list[str]) -> None:
    """Extra DNS names must be fully qualified host names: a single label (agent2) could be
    another node's name."""
    for value in dns:
        if not DNS_NAME.match(value) or is_ip(value) or "." not in value:
            raise TlsError(f"{name}: extra DNS name {value!r} is not a fully qualified host "
                           "name (e.g. agent1.lab.example)")
    for value in ips:
        if not is_ip(value):
            raise TlsError(f"{name}: {value!r} is not an IP address")


def request_certificate(out: str | os.PathLike[str], name: str, *, ips: list[str] | None = None,
                        dns: list[str] | None = None, key_type: str = "ec",
                        overwrite: bool = False) -> tuple[Path, Path]:
    """OUT/NAME.key (0600, in a 0700 folder) and OUT/NAME.csr; returns both paths."""
    folder = Path(out)
    check_node_name(name)
    ips, dns = list(dict.fromkeys(ips or [])), list(dict.fromkeys(d for d in dns or []
                                                                  if d != name))
    _check_sans(name, dns, ips)
    key_path, csr_path = folder / f"{name}.key", folder / f"{name}{CSR_SUFFIX}"
    existing = [str(p) for p in (key_path, csr_path) if p.exists()]
    if existing and not overwrite:
        raise TlsError(f"refusing to overwrite {', '.join(existing)} (use --force)")
    key = new_key(key_type)
    sans: list[x509.GeneralName] = [x509.DNSName(name), *map(x509.DNSName, dns)]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .sign(key, hashes.SHA256()))
    private_folder(folder)
    write_private(key_path, key_pem(key))
    write_public(csr_path, csr.public_bytes(serialization.Encoding.PEM))
    return key_path, csr_path


# ------------------------------------------------------------------------------- signing


@dataclass(frozen=True)
class Request:
    """What a checked signing request asks for."""

    name: str
    dns: tuple[str, ...]
    ips: tuple[str, ...]
    public_key: Any
    ignored: tuple[str, ...]  # extensions of the request that the certificate does not take


@dataclass(frozen=True)
class Signed:
    """What `sign_request` issued, for the operator to read."""

    request: Request
    certificate: x509.Certificate
    cert_path: Path
    ca_path: Path
    replaced: tuple[str, ...]  # serials of earlier certificates of this name for other keys

    def lines(self) -> list[str]:
        cert, req = self.certificate, self.request
        names = [f"DNS:{d}" for d in (req.name, *req.dns)] + [f"IP:{i}" for i in req.ips]
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        key = f"{describe_key(req.public_key)}, sha256 {key_fingerprint(req.public_key)}"
        days = (end - start).days
        out = [f"signed {req.name}:",
               f"  subject   {cert.subject.rfc4514_string()}",
               f"  names     {', '.join(names)}",
               f"  key       {key}",
               f"  valid     {start:%Y-%m-%d %H:%M:%S}Z to {end:%Y-%m-%d %H:%M:%S}Z ({days} days)",
               f"  serial    {cert.serial_number:#x}",
               f"  issuer    {cert.issuer.rfc4514_string()}",
               "  usage     TLS server and client, not a CA"]
        if req.ignored:
            out.append(f"  ignored   requested extensions {', '.join(req.ignored)}")
        if self.replaced:
            out.append(f"  replaces  serial {', '.join(self.replaced)} (for another key; still "
                       "valid until it expires)")
        out.append(f"wrote {self.cert_path} and {self.ca_path}")
        return out


def read_request(path: str | os.PathLike[str]) -> Request:
    """Load a PEM signing request and check everything it asks for (TlsError otherwise)."""
    source = Path(path)
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the signing request {source}: {exc.strerror or exc}") \
            from None
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError:
        raise TlsError(f"{source} is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise TlsError(f"{source}: the request's signature does not verify with its own key "
                       "(altered after it was made?)")
    attributes = list(csr.subject)
    if len(attributes) != 1 or attributes[0].oid != NameOID.COMMON_NAME:
        raise TlsError(f"{source}: the subject must be CN=NAME only, got "
                       f"{csr.subject.rfc4514_string()!r}")
    name = str(attributes[0].value)
    try:
        check_node_name(name)
    except TlsError as exc:
        raise TlsError(f"{source}: {exc}") from None
    _check_key(source, csr.public_key())
    dns, ips, ignored = _requested(source, name, csr)
    return Request(name=name, dns=dns, ips=ips, public_key=csr.public_key(), ignored=ignored)


def _check_key(source: Path, key: Any) -> None:
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in EC_CURVES:
        return
    if isinstance(key, rsa.RSAPublicKey) and key.key_size >= MIN_RSA_BITS:
        return
    raise TlsError(f"{source}: the key must be EC ({', '.join(EC_CURVES)}) or RSA of at least "
                   f"{MIN_RSA_BITS} bits, got {describe_key(key)}")


def _requested(source: Path, name: str, csr: x509.CertificateSigningRequest,
               ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(extra DNS names, IP addresses, ignored extensions) the request asks for."""
    dns: list[str] = []
    ips: list[str] = []
    ignored: list[str] = []
    for ext in csr.extensions:
        value = ext.value
        if isinstance(value, x509.BasicConstraints) and value.ca:
            raise TlsError(f"{source}: the request asks for CA rights (basicConstraints CA:TRUE);"
                           " a node certificate never signs certificates")
        if isinstance(value, x509.KeyUsage) and (value.key_cert_sign or value.crl_sign):
            raise TlsError(f"{source}: the request asks for CA rights (keyUsage keyCertSign or "
                           "cRLSign); a node certificate never signs certificates")
        if isinstance(value, x509.SubjectAlternativeName):
            others = [g for g in value if not isinstance(g, x509.DNSName | x509.IPAddress)]
            if others:
                raise TlsError(f"{source}: only DNS and IP names can be certified, got "
                               f"{', '.join(type(g).__name__ for g in others)}")
            dns = [d for d in value.get_values_for_type(x509.DNSName) if d != name]
            ips = [str(i) for i in value.get_values_for_type(x509.IPAddress)]
        elif ext.oid not in READ_EXTENSIONS:
            ignored.append(ext.oid.dotted_string if isinstance(value, x509.UnrecognizedExtension)
                           else type(value).__name__)
    dns, ips = list(dict.fromkeys(dns)), list(dict.fromkeys(ips))
    _check_sans(name, dns, ips)
    return tuple(dns), tuple(ips), tuple(ignored)


def _ledger(folder: Path) -> list[dict[str, Any]]:
    path = folder / LEDGER
    if not path.exists():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise TlsError(f"cannot read the CA's ledger {path}: {exc}") from None


def _check_ledger(records: list[dict[str, Any]], request: Request, *, replace: bool
                  ) -> tuple[str, ...]:
    """Refuse names held by another node's certificate, and a second key for the same name
    unless `replace`; returns the serials a replacement supersedes."""
    owner = {n.casefold(): r["name"] for r in records for n in (r["name"], *r["dns"])}
    for value in (request.name, *request.dns):
        held = owner.get(value.casefold())
        if held is not None and held != request.name:
            raise TlsError(f"{request.name}: the name {value!r} is already in the certificate of "
                           f"{held}: a certificate carrying it could speak for {held}")
    fingerprint = key_fingerprint(request.public_key)
    mine = [r for r in records if r["name"] == request.name]
    if not mine or mine[-1]["key"] == fingerprint:  # a new name, or a renewal for its key
        return ()
    if not replace:
        raise TlsError(f"{request.name} already has a certificate for another key (serial "
                       f"{mine[-1]['serial']}); give --replace to issue one for this key "
                       "(the old certificate stays valid until it expires)")
    return tuple(r["serial"] for r in mine if r["key"] != fingerprint)


def sign_request(ca: str | os.PathLike[str], csr: str | os.PathLike[str],
                 out: str | os.PathLike[str], *, days: int = DEFAULT_DAYS,
                 overwrite: bool = False, replace: bool = False) -> Signed:
    """Check CSR, issue OUT/NAME.pem with CA/ca.key, copy CA/ca.pem to OUT, record it."""
    check_days(days)
    folder, target = Path(ca), Path(out)
    ca_cert, ca_key = load_ca(folder)
    request = read_request(csr)
    replaced = _check_ledger(_ledger(folder), request, replace=replace)
    now = datetime.datetime.now(datetime.UTC)
    if ca_cert.not_valid_after_utc <= now:
        raise TlsError(f"the CA in {folder} expired on {ca_cert.not_valid_after_utc:%Y-%m-%d}")
    cert_path, ca_path = target / f"{request.name}.pem", target / CA_CERT
    ca_bytes = cert_pem(ca_cert)
    if cert_path.exists() and not overwrite:
        raise TlsError(f"refusing to overwrite {cert_path} (use --force)")
    if ca_path.exists() and ca_path.read_bytes() != ca_bytes and not overwrite:
        raise TlsError(f"{ca_path} holds another CA's certificate (use --force to replace it)")
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = node_certificate(ca_cert, ca_key, request.public_key, request.name,
                            dns=request.dns, ips=request.ips, not_after=not_after)
    target.mkdir(parents=True, exist_ok=True)
    write_public(cert_path, cert_pem(cert))
    write_public(ca_path, ca_bytes)
    record = {"serial": f"{cert.serial_number:#x}", "name": request.name,
              "dns": list(request.dns), "ips": list(request.ips),
              "key": key_fingerprint(request.public_key),
              "not_after": f"{not_after:%Y-%m-%dT%H:%M:%SZ}", "signed": f"{now:%Y-%m-%dT%H:%M:%SZ}"}
    with open(folder / LEDGER, "a") as ledger:
        ledger.write(json.dumps(record, sort_keys=True) + "\n")
    return Signed(request=request, certificate=cert, cert_path=cert_path, ca_path=ca_path,
                  replaced=replaced)
