"""`efpsn certs init-ca | request | sign`: each party's key stays in its own folder, the CA signs
its request; what comes out verifies with openssl, works for mutual TLS, and bad requests are
refused with one line."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import stat
import subprocess
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.registry import NAME_PATTERN
from efpsn.cli.main import main
from efpsn.wire.csr import LEDGER
from efpsn.wire.tls import NODE_NAME, TlsConfig, caller_names, names_in_certificate


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _flow(tmp_path: Path, name: str, *extra: str) -> Path:
    """The party's request in tmp/NAME, the CA's signature back into the same folder; returns
    the party's folder (a --tls-dir for NAME)."""
    party = tmp_path / name
    assert main(["certs", "request", "--name", name, "--out", str(party), *extra]) == 0
    assert main(["certs", "sign", "--ca", str(tmp_path / "ca"), "--csr",
                 str(party / f"{name}.csr"), "--out", str(tmp_path / "signed" / name)]) == 0
    for file in (f"{name}.pem", "ca.pem"):  # the public answer travels back to the party
        shutil.copy(tmp_path / "signed" / name / file, party / file)
    return party


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    assert main(["certs", "init-ca", "--out", str(tmp_path / "ca")]) == 0
    return tmp_path / "ca"


def _write_csr(path: Path, key, subject: x509.Name, *extensions: x509.ExtensionType) -> Path:
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    for ext in extensions:
        builder = builder.add_extension(ext, critical=False)
    path.write_bytes(builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return path


def _cn(name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def _sign_error(tmp_path: Path, ca: Path, csr: Path, capsys: pytest.CaptureFixture[str],
                *flags: str) -> str:
    code = main(["certs", "sign", "--ca", str(ca), "--csr", str(csr),
                 "--out", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("efpsn: error: "), err
    return err


# ------------------------------------------------------------------------------- the flow


@pytest.mark.process
def test_signed_certificate_verifies_with_openssl_and_matches_the_partys_key(
        tmp_path: Path, ca: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # prepare / execute: init-ca, request on the party's side, sign on the CA's side
    capsys.readouterr()
    party = _flow(tmp_path, "agent1", "--ip", "10.0.0.11", "--dns", "agent1.lab.example")
    printed = capsys.readouterr().out
    # assert: modes, what each side holds, and what sign printed
    assert stat.S_IMODE((ca / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(ca.stat().st_mode) == 0o700
    assert stat.S_IMODE((party / "agent1.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(party.stat().st_mode) == 0o700
    assert sorted(p.name for p in ca.iterdir()) == ["ca.key", "ca.pem", LEDGER]
    assert sorted(p.name for p in (tmp_path / "signed" / "agent1").iterdir()) == [
        "agent1.pem", "ca.pem"]
    cert = _cert(party / "agent1.pem")
    names = "names     DNS:agent1, DNS:agent1.lab.example, IP:10.0.0.11"
    for line in ("subject   CN=agent1", names, f"serial    {cert.serial_number:#x}", "valid  "):
        assert line in printed, printed
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(ca / "ca.pem"),
                             str(party / "agent1.pem")], capture_output=True, text=True,
                            timeout=60, check=False)
    assert verify.returncode == 0 and verify.stdout.strip().endswith(": OK"), verify
    keys = [subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
            for cmd in (["openssl", "x509", "-in", str(party / "agent1.pem"), "-noout", "-pubkey"],
                        ["openssl", "pkey", "-in", str(party / "agent1.key"), "-pubout"])]
    assert keys[0] == keys[1] and "PUBLIC KEY" in keys[0]
    # the same certificate `efpsn certs --names` issues: CN, DNS SANs, usages, not a CA
    assert cert.subject.rfc4514_string() == "CN=agent1"
    assert names_in_certificate(cert.public_bytes(serialization.Encoding.PEM)) == frozenset(
        {"agent1", "agent1.lab.example"})
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    TlsConfig.from_dir(party, "agent1").require_name("agent1")


def test_the_key_is_never_written_outside_the_partys_folder(tmp_path: Path, ca: Path) -> None:
    parties = {name: _flow(tmp_path, name) for name in ("coordinator", "agent1", "agent2")}
    for name, party in parties.items():
        key = serialization.load_pem_private_key((party / f"{name}.key").read_bytes(), None)
        secrets = [(party / f"{name}.key").read_bytes().strip(),
                   key.private_bytes(serialization.Encoding.DER,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()),
                   key.private_numbers().private_value.to_bytes(32, "big")]
        for path in tmp_path.rglob("*"):
            if path.is_file() and path != party / f"{name}.key":
                data = path.read_bytes()
                assert not any(s in data for s in secrets), (name, path)


def test_mutual_tls_between_nodes_whose_certificates_came_from_requests(
        tmp_path: Path, ca: Path) -> None:
    server_tls = TlsConfig.from_dir(_flow(tmp_path, "agent1"), "agent1")
    client_tls = TlsConfig.from_dir(_flow(tmp_path, "agent2"), "agent2")
    seen: list[frozenset[str] | None] = []

    class Health(health.aio.HealthServicer):
        async def Check(self, request, context):
            seen.append(caller_names(context))
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def call() -> int:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
        port = server.add_secure_port("127.0.0.1:0", server_tls.server_credentials())
        await server.start()
        try:
            async with grpc.aio.secure_channel(
                    f"127.0.0.1:{port}", client_tls.channel_credentials(),
                    options=[("grpc.ssl_target_name_override", "agent1")]) as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=10)
        finally:
            await server.stop(0)
        return reply.status

    assert asyncio.run(call()) == health_pb2.HealthCheckResponse.SERVING
    assert seen == [frozenset({"agent2"})]


def test_validity_never_outlasts_the_ca(tmp_path: Path) -> None:
    assert main(["certs", "init-ca", "--out", str(tmp_path / "ca"), "--days", "10"]) == 0
    party = _flow(tmp_path, "agent1")
    assert _cert(party / "agent1.pem").not_valid_after_utc == _cert(
        tmp_path / "ca" / "ca.pem").not_valid_after_utc


def test_node_names_follow_the_coordinators_rule() -> None:
    assert NODE_NAME.pattern == NAME_PATTERN.pattern


# ------------------------------------------------------------------------------- refusals


def test_tampered_request_is_refused(tmp_path: Path, ca: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    csr = _write_csr(tmp_path / "agent1.csr", ec.generate_private_key(ec.SECP256R1()),
                     _cn("agent1"))
    pem = csr.read_bytes()
    der = x509.load_pem_x509_csr(pem).public_bytes(serialization.Encoding.DER)
    tampered = x509.load_der_x509_csr(der.replace(b"agent1", b"agent7"))  # still parses
    csr.write_bytes(tampered.public_bytes(serialization.Encoding.PEM))
    assert "signature does not verify" in _sign_error(tmp_path, ca, csr, capsys)
    csr.write_bytes(pem.replace(b"MI", b"XX", 1))
    assert "not a PEM certificate signing request" in _sign_error(tmp_path, ca, csr, capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("subject", "extensions", "key", "match"), [
    ("bad name", (), "ec", "name must match"),
    ("10.0.0.1", (), "ec", "not be an IP"),
    ("agent1", (x509.BasicConstraints(ca=True, path_length=None),), "ec", "asks for CA rights"),
    ("agent1", (x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=False,
        encipher_only=False, decipher_only=False),), "ec", "asks for CA rights"),
    ("agent1", (x509.SubjectAlternativeName([x509.RFC822Name("a@example.org")]),), "ec",
     "only DNS and IP names"),
    ("agent1", (x509.SubjectAlternativeName([x509.DNSName("agent2")]),), "ec",
     "not a fully qualified host name"),
    ("agent1", (), "rsa1024", "at least 2048 bits"),
])
def test_bad_requests_are_refused_with_one_line(
        tmp_path: Path, ca: Path, capsys: pytest.CaptureFixture[str], subject: str,
        extensions: tuple, key: str, match: str) -> None:
    private = (rsa.generate_private_key(public_exponent=65537, key_size=1024) if key == "rsa1024"
               else ec.generate_private_key(ec.SECP256R1()))
    csr = _write_csr(tmp_path / "x.csr", private, _cn(subject), *extensions)
    assert match in _sign_error(tmp_path, ca, csr, capsys)
    assert not (tmp_path / "out").exists()


def test_subject_with_more_than_a_common_name_is_refused(
        tmp_path: Path, ca: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "agent2"),
                         x509.NameAttribute(NameOID.COMMON_NAME, "agent1")])
    csr = _write_csr(tmp_path / "x.csr", ec.generate_private_key(ec.SECP256R1()), subject)
    assert "the subject must be CN=NAME only" in _sign_error(tmp_path, ca, csr, capsys)


def test_no_name_is_certified_for_two_nodes_or_two_keys(
        tmp_path: Path, ca: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _flow(tmp_path, "agent1", "--dns", "Agent2.lab")  # agent1 also answers to agent2.lab
    capsys.readouterr()
    # a node named like agent1's extra name, in another letter case, is refused
    csr = _write_csr(tmp_path / "x.csr", ec.generate_private_key(ec.SECP256R1()),
                     _cn("agent2.LAB"))
    assert "already in the certificate of agent1" in _sign_error(tmp_path, ca, csr, capsys)
    # a second key for agent1 needs --replace, which then says what it replaces
    csr = _write_csr(tmp_path / "y.csr", ec.generate_private_key(ec.SECP256R1()), _cn("agent1"))
    assert "--replace" in _sign_error(tmp_path, ca, csr, capsys)
    assert main(["certs", "sign", "--ca", str(ca), "--csr", str(csr), "--out",
                 str(tmp_path / "new"), "--replace"]) == 0
    assert "replaces  serial 0x" in capsys.readouterr().out
    # the same key signed again (a renewal) needs nothing
    assert main(["certs", "sign", "--ca", str(ca), "--csr", str(csr), "--out",
                 str(tmp_path / "new"), "--force"]) == 0


def test_steps_refuse_to_overwrite_and_to_mix_with_the_one_operator_flags(
        tmp_path: Path, ca: Path, capsys: pytest.CaptureFixture[str]) -> None:
    party = _flow(tmp_path, "agent1")
    capsys.readouterr()
    for argv, match in (
        (["certs", "init-ca", "--out", str(ca)], "refusing to overwrite"),
        (["certs", "request", "--name", "agent1", "--out", str(party)], "refusing to overwrite"),
        (["certs", "sign", "--ca", str(ca), "--csr", str(party / "agent1.csr"), "--out",
          str(party)], "refusing to overwrite"),
        (["certs", "sign", "--ca", str(tmp_path / "nowhere"), "--csr", "x.csr", "--out", "o"],
         "cannot read the CA"),
        (["certs", "sign", "--ca", str(ca), "--csr", str(tmp_path / "none.csr"), "--out", "o"],
         "cannot read the signing request"),
        (["certs", "--names", "agent1", "request", "--name", "agent1", "--out", "o"],
         "--names before `request`"),
        (["certs"], "give a step"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert match in err and err.count("\n") == 1, (argv, err)
    other = tmp_path / "other-ca"
    assert main(["certs", "init-ca", "--out", str(other)]) == 0
    csr = _write_csr(tmp_path / "agent3.csr", ec.generate_private_key(ec.SECP256R1()),
                     _cn("agent3"))
    assert main(["certs", "sign", "--ca", str(other), "--csr", str(csr), "--out",
                 str(party)]) == 2  # party/ca.pem is the first CA's
    assert "holds another CA's certificate" in capsys.readouterr().err


def test_an_expired_ca_signs_nothing(tmp_path: Path, ca: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    key = serialization.load_pem_private_key((ca / "ca.key").read_bytes(), None)
    old = _cert(ca / "ca.pem")
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(old.subject)
               .public_key(key.public_key()).serial_number(1)
               .not_valid_before(past - datetime.timedelta(days=1)).not_valid_after(past)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(key, hashes.SHA256()))
    (ca / "ca.pem").write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    csr = _write_csr(tmp_path / "a.csr", ec.generate_private_key(ec.SECP256R1()), _cn("agent1"))
    assert "expired" in _sign_error(tmp_path, ca, csr, capsys)
