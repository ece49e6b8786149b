"""Mutual TLS for the coordinator and the agents: a private CA, per-node certificates, gRPC
credentials, and the peer identity (certificate name) of a caller.

Every node (the coordinator and each agent) holds `ca.pem`, `NAME.pem` and `NAME.key`. A node's
certificate names it twice: as its subject common name and as a DNS subject-alternative name
(plus any extra DNS and IP SANs, e.g. the address it is reached at). `generate_certificates`
makes every node's key in one folder (one operator); efpsn.wire.csr issues certificates from
signing requests, so that each key stays on its party's host. Servers require a client
certificate signed by the same CA; clients check the server's certificate against the name of
the peer they mean to reach (`grpc.ssl_target_name_override`), also when they dial an IP address.

The identity of a caller is the set of its certificate's DNS SANs and its CN; IP SANs never count
as names. `efpsn certs` refuses extra DNS SANs that equal another node's name (in any letter
case), so no certificate it issues can speak for another node.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_CERT",
    "KEY_TYPES",
    "TlsConfig",
    "TlsError",
    "caller_names",
    "generate_certificates",
    "names_in_certificate",
]

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
KEY_TYPES = ("ec", "rsa")
DEFAULT_DAYS = 365
RSA_BITS = 3072
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # same rule as agent names


class TlsError(ValueError):
    """Bad TLS material or options (missing file, wrong name, cert not from the CA, ...)."""


# ------------------------------------------------------------------------------- generation


def new_key(key_type: str) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    """A fresh private key: EC P-256 ("ec") or RSA 3072 ("rsa")."""
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    raise TlsError(f"key type must be one of {KEY_TYPES}, got {key_type!r}")


def write_private(path: Path, data: bytes) -> None:
    """Write a secret atomically with mode 0600 from the first byte on."""
    tmp = path.with_name(path.name + ".part")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def private_folder(folder: Path) -> None:
    """Create `folder` (and parents) readable by its owner only."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def key_pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def check_days(days: int) -> None:
    if not 1 <= days <= 3650:
        raise TlsError(f"days must be in [1, 3650], got {days}")


def new_ca(key_type: str, *, days: int) -> tuple[x509.Certificate, Any]:
    """A self-signed CA certificate that may sign node certificates only (path length 0)."""
    key = new_key(key_type)
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "EFPSN run CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "EFPSN")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def node_certificate(ca_cert: x509.Certificate, ca_key: Any, public_key: Any, name: str, *,
                     dns: Sequence[str] = (), ips: Sequence[str] = (),
                     not_after: datetime.datetime) -> x509.Certificate:
    """The certificate of node `name`: CN=name, DNS SANs name + `dns`, IP SANs `ips`, usable
    for TLS servers and clients, never for signing certificates."""
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(name)]
    sans += [x509.DNSName(d) for d in dict.fromkeys(dns) if d != name]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in dict.fromkeys(ips)]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False,
            key_encipherment=isinstance(public_key, rsa.RSAPublicKey), data_encipherment=False,
            key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False,
            decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def check_node_name(name: str) -> None:
    if not NODE_NAME.match(name) or is_ip(name):
        raise TlsError(f"name must match {NODE_NAME.pattern} and not be an IP, got {name!r}")


def _split_per_node(values: Sequence[str], names: Sequence[str], what: str) -> dict[str, list[str]]:
    """'VALUE' applies to every node, 'NAME=VALUE' to that node only."""
    out: dict[str, list[str]] = {name: [] for name in names}
    for raw in values:
        for item in (v.strip() for v in raw.split(",")):
            if not item:
                continue
            name, sep, value = item.partition("=")
            if sep:
                if name not in out:
                    raise TlsError(
                        f"--{what} {item}: {name!r} is not one of the names {list(names)}")
                out[name].append(value)
            else:
                for node in names:
                    out[node].append(item)
    return out


def generate_certificates(
    out: str | os.PathLike[str],
    names: Sequence[str],
    *,
    ips: Sequence[str] = ("127.0.0.1",),
    dns: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    key_type: str = "ec",
    overwrite: bool = False,
) -> dict[str, Path]:
    """A CA (reused when OUT already holds ca.pem + ca.key) and one key/certificate per name:
    one operator makes every node's key (efpsn.wire.csr keeps each key on its party's host).

    ips/dns entries are 'VALUE' (every certificate) or 'NAME=VALUE' (that one only). Every
    certificate carries DNS:NAME and CN=NAME. Private keys are written with mode 0600.
    Returns {name: certificate path}.
    """
    folder = Path(out)
    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names:
        raise TlsError("give at least one name (e.g. --names coordinator,agent1,agent2)")
    for name in names:
        check_node_name(name)
    check_days(days)
    ip_map = _split_per_node(ips, names, "ip")
    dns_map = _split_per_node(dns, names, "dns")
    folded = {n.casefold(): n for n in names}
    for name in names:
        for value in ip_map[name]:
            if not is_ip(value):
                raise TlsError(f"--ip {value!r} is not an IP address")
        for value in dns_map[name]:
            if folded.get(value.casefold(), name) != name:
                raise TlsError(f"extra DNS name {value!r} of {name} is another node's name: "
                               "that certificate could then speak for it")
    private_folder(folder)
    targets = [folder / f"{n}{ext}" for n in names for ext in (".pem", ".key")]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise TlsError(f"refusing to overwrite {', '.join(existing)} (use --force)")

    ca_cert_path, ca_key_path = folder / CA_CERT, folder / CA_KEY
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    else:
        ca_cert, ca_key = new_ca(key_type, days=days)
        write_private(ca_key_path, key_pem(ca_key))
        write_public(ca_cert_path, cert_pem(ca_cert))

    not_after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days)
    written: dict[str, Path] = {}
    for name in names:
        key = new_key(key_type)
        cert = node_certificate(ca_cert, ca_key, key.public_key(), name, dns=dns_map[name],
                                ips=ip_map[name], not_after=not_after)
        write_private(folder / f"{name}.key", key_pem(key))
        write_public(folder / f"{name}.pem", cert_pem(cert))
        written[name] = folder / f"{name}.pem"
    return written


def public_der(public_key: Any) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------- identity


@functools.lru_cache(maxsize=256)
def names_in_certificate(pem: bytes) -> frozenset[str]:
    """The names a certificate speaks for: its DNS SANs and its subject CN (never IP SANs)."""
    cert = x509.load_pem_x509_certificate(pem)
    names: set[str] = set()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names.update(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        pass
    for attr in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME):
        value = attr.value if isinstance(attr.value, str) else attr.value.decode(errors="replace")
        names.add(value)
    return frozenset(n for n in names if not is_ip(n))


def caller_names(context: Any) -> frozenset[str] | None:
    """Names in the verified client certificate of an RPC; None on a plaintext connection,
    an empty set on TLS without a client certificate (never with require_client_auth)."""
    auth: Mapping[str, Sequence[bytes]] = context.auth_context() or {}
    security = auth.get("transport_security_type") or []
    if b"ssl" not in security:
        return None
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        return frozenset()
    try:
        return names_in_certificate(bytes(pems[0]))
    except ValueError:
        return frozenset()


# ------------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class TlsConfig:
    """One node's TLS material (PEM bytes): its certificate chain and key, and the CA."""

    cert: bytes
    key: bytes
    ca: bytes
    cert_path: str = ""

    @classmethod
    def from_files(cls, *, cert: str | os.PathLike[str], key: str | os.PathLike[str],
                   ca: str | os.PathLike[str]) -> TlsConfig:
        """Load and check: readable files, a certificate issued by the CA, a matching key."""
        data = {}
        for what, path in (("certificate", cert), ("key", key), ("CA certificate", ca)):
            try:
                data[what] = Path(path).read_bytes()
            except OSError as exc:
                raise TlsError(
                    f"cannot read the TLS {what} {path}: {exc.strerror or exc}") from None
        config = cls(cert=data["certificate"], key=data["key"], ca=data["CA certificate"],
                     cert_path=str(cert))
        config.check()
        return config

    @classmethod
    def from_dir(cls, folder: str | os.PathLike[str], name: str) -> TlsConfig:
        """DIR/ca.pem, DIR/NAME.pem, DIR/NAME.key (as written by `efpsn certs`)."""
        base = Path(folder)
        return cls.from_files(cert=base / f"{name}.pem", key=base / f"{name}.key",
                              ca=base / CA_CERT)

    def check(self) -> None:
        try:
            cert = x509.load_pem_x509_certificate(self.cert)
        except ValueError:
            raise TlsError(f"{self.cert_path or 'certificate'} is not a PEM certificate") from None
        try:
            ca = x509.load_pem_x509_certificate(self.ca)
        except ValueError:
            raise TlsError("the CA file is not a PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(self.key, password=None)
        except (ValueError, TypeError):
            raise TlsError(f"the key of {self.cert_path or 'the certificate'} is not an "
                           "unencrypted PEM private key") from None
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            raise TlsError(f"{self.cert_path or 'the certificate'} was not issued by the CA "
                           f"{ca.subject.rfc4514_string()}") from None
        if public_der(key.public_key()) != public_der(cert.public_key()):
            raise TlsError(f"the key does not belong to {self.cert_path or 'the certificate'}")

    @property
    def names(self) -> frozenset[str]:
        """The names this node's own certificate speaks for."""
        return names_in_certificate(self.cert)

    def require_name(self, name: str) -> None:
        if name not in self.names:
            raise TlsError(f"certificate {self.cert_path or ''} is for {sorted(self.names)}, "
                           f"not {name!r}".replace("  ", " "))

    def server_credentials(self) -> grpc.ServerCredentials:
        """Mutual TLS: clients must present a certificate issued by the CA."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side of mutual TLS: verify the server against the CA, present our certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def options_given(values: Iterable[object]) -> bool:
    return any(v not in (None, "") for v in values)
