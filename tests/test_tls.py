"""Certificates and mutual TLS: what `efpsn certs` writes, what TlsConfig refuses, and the
identity a server sees for a caller."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from efpsn.cli.main import main
from efpsn.wire.tls import (
    TlsConfig,
    TlsError,
    caller_names,
    generate_certificates,
    names_in_certificate,
)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _sans(cert: x509.Certificate) -> tuple[list[str], set[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName), {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def test_certificates_name_each_node_with_dns_and_ip_sans(tmp_path: Path) -> None:
    # prepare / execute
    generate_certificates(tmp_path, ["coordinator", "agent1", "agent2"],
                          ips=["127.0.0.1", "agent1=10.9.0.11"], dns=["agent2=a2.example"])
    # assert: DNS:NAME (+ extras), IP SANs, CN, both key usages, signed by the CA
    ca = _cert(tmp_path / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for name, dns, ips in (("coordinator", ["coordinator"], {"127.0.0.1"}),
                           ("agent1", ["agent1"], {"127.0.0.1", "10.9.0.11"}),
                           ("agent2", ["agent2", "a2.example"], {"127.0.0.1"})):
        cert = _cert(tmp_path / f"{name}.pem")
        assert _sans(cert) == (dns, ips)
        assert cert.subject.rfc4514_string() == f"CN={name}"
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        cert.verify_directly_issued_by(ca)
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
        assert cert.public_key().curve.name == "secp256r1"
        assert names_in_certificate(cert.public_bytes(Encoding.PEM)) == frozenset(dns)
    # private keys are 0600, the folder 0700
    for key in tmp_path.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700


def test_rsa_keys_are_3072_bits(tmp_path: Path) -> None:
    generate_certificates(tmp_path, ["agent1"], key_type="rsa")
    key = _cert(tmp_path / "agent1.pem").public_key()
    assert isinstance(key, rsa.RSAPublicKey) and key.key_size == 3072


def test_existing_ca_is_reused_and_existing_nodes_are_not_overwritten(tmp_path: Path) -> None:
    generate_certificates(tmp_path, ["agent1"])
    ca_before = (tmp_path / "ca.pem").read_bytes()
    generate_certificates(tmp_path, ["agent2"])  # a new node under the same CA
    assert (tmp_path / "ca.pem").read_bytes() == ca_before
    _cert(tmp_path / "agent2.pem").verify_directly_issued_by(_cert(tmp_path / "ca.pem"))
    with pytest.raises(TlsError, match="refusing to overwrite"):
        generate_certificates(tmp_path, ["agent1"])
    generate_certificates(tmp_path, ["agent1"], overwrite=True)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"names": ["agent1", "agent2"], "dns": ["agent1=agent2"]}, "another node's name"),
    ({"names": ["agent1"], "ips": ["agent7=10.0.0.1"]}, "not one of the names"),
    ({"names": ["agent1"], "ips": ["not-an-ip"]}, "not an IP"),
    ({"names": ["10.0.0.1"]}, "not be an IP"),
    ({"names": ["bad name"]}, "must match"),
    ({"names": []}, "at least one name"),
])
def test_bad_certificate_requests_are_refused(tmp_path: Path, kwargs: dict, match: str) -> None:
    names = kwargs.pop("names")
    with pytest.raises(TlsError, match=match):
        generate_certificates(tmp_path, names, **kwargs)


def test_tls_config_refuses_foreign_mismatched_and_misnamed_material(tmp_path: Path) -> None:
    generate_certificates(tmp_path / "a", ["agent1", "agent2"])
    generate_certificates(tmp_path / "b", ["agent1"])
    a, b = tmp_path / "a", tmp_path / "b"
    config = TlsConfig.from_dir(a, "agent1")
    assert config.names == frozenset({"agent1"})
    config.require_name("agent1")
    with pytest.raises(TlsError, match="not 'agent2'"):
        config.require_name("agent2")
    with pytest.raises(TlsError, match="not issued by the CA"):
        TlsConfig.from_files(cert=b / "agent1.pem", key=b / "agent1.key", ca=a / "ca.pem")
    with pytest.raises(TlsError, match="does not belong"):
        TlsConfig.from_files(cert=a / "agent1.pem", key=a / "agent2.key", ca=a / "ca.pem")
    with pytest.raises(TlsError, match="cannot read the TLS certificate"):
        TlsConfig.from_dir(a, "agent9")
    with pytest.raises(TlsError, match="not a PEM certificate"):
        TlsConfig.from_files(cert=a / "agent1.key", key=a / "agent1.key", ca=a / "ca.pem")


def test_mutual_tls_admits_only_ca_clients_and_reports_their_names(tmp_path: Path) -> None:
    generate_certificates(tmp_path / "run", ["agent1", "agent2"], dns=["agent2=a2.example"])
    generate_certificates(tmp_path / "other", ["agent2"])
    server_tls = TlsConfig.from_dir(tmp_path / "run", "agent1")
    client_tls = TlsConfig.from_dir(tmp_path / "run", "agent2")
    foreign = (tmp_path / "other" / "agent2.pem").read_bytes(), (
        tmp_path / "other" / "agent2.key").read_bytes()
    seen: list[frozenset[str] | None] = []

    class Health(health.aio.HealthServicer):
        async def Check(self, request, context):
            seen.append(caller_names(context))
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def scenario() -> dict[str, str]:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
        port = server.add_secure_port("127.0.0.1:0", server_tls.server_credentials())
        await server.start()
        clients = {
            "good": (client_tls.channel_credentials(), "agent1"),
            "server name mismatch": (client_tls.channel_credentials(), "agent2"),
            "no client certificate": (grpc.ssl_channel_credentials(server_tls.ca), "agent1"),
            "foreign CA": (grpc.ssl_channel_credentials(server_tls.ca, foreign[1], foreign[0]),
                           "agent1"),
        }
        out = {}
        try:
            for label, (creds, name) in clients.items():
                async with grpc.aio.secure_channel(
                        f"127.0.0.1:{port}", creds,
                        options=[("grpc.ssl_target_name_override", name)]) as channel:
                    try:
                        await health_pb2_grpc.HealthStub(channel).Check(
                            health_pb2.HealthCheckRequest(), timeout=5)
                        out[label] = "OK"
                    except grpc.aio.AioRpcError as exc:
                        out[label] = exc.code().name
        finally:
            await server.stop(0)
        return out

    outcome = asyncio.run(scenario())
    assert outcome == {"good": "OK", "server name mismatch": "UNAVAILABLE",
                       "no client certificate": "UNAVAILABLE", "foreign CA": "UNAVAILABLE"}
    assert seen == [frozenset({"agent2", "a2.example"})]  # DNS SANs and CN, never IPs


def test_caller_names_without_tls_or_certificate() -> None:
    class Ctx:
        def __init__(self, auth):
            self._auth = auth

        def auth_context(self):
            return self._auth

    assert caller_names(Ctx({})) is None
    assert caller_names(Ctx({"transport_security_type": [b"ssl"]})) == frozenset()
    assert caller_names(Ctx({"transport_security_type": [b"ssl"],
                             "x509_pem_cert": [b"garbage"]})) == frozenset()


def test_certs_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tls"
    assert main(["certs", "--out", str(out), "--names", "coordinator,agent1,agent2",
                 "--ip", "agent1=10.1.0.11", "--dns", "agent2=agent2.lan"]) == 0
    printed = capsys.readouterr().out
    assert "ca.pem" in printed and "mode 0600" in printed
    assert _sans(_cert(out / "agent1.pem")) == (["agent1"], {"127.0.0.1", "10.1.0.11"})
    assert _sans(_cert(out / "agent2.pem")) == (["agent2", "agent2.lan"], {"127.0.0.1"})
    assert main(["certs", "--out", str(out), "--names", "agent1"]) == 2  # exists: one-line error
    assert "refusing to overwrite" in capsys.readouterr().err
