"""SPEC §12, TLS: ``verify=`` of ``Client`` and ``AsyncClient`` (httpx's
convention), against an HTTPS server started here, whose certificate is
signed by a CA made here. With that CA trusted the call succeeds; with the
default trust store or another CA it fails with ``TransportError`` because
the certificate is not verified. No settle server is needed."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from settle_client import AsyncClient, Client, TransportError

RECORD: dict[str, Any] = {
    "key": "k",
    "status": "running",
    "rank": 0,
    "reservation": {"fingerprint": "0" * 64, "principal": "svc", "scopes": [], "generation": 0},
    "lease": {"fence": 1, "worker": "w1", "expires_at": "2026-01-01T00:00:30Z"},
    "outcome": None,
    "receipt": None,
    "reconcile_required": False,
    "disputed": False,
    "attempts": [],
    "quarantine": [],
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
    "expires_at": None,
}


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass
class _CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @staticmethod
    def make(name: str) -> _CA:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return _CA(key, cert)

    def issue(self, directory: Path) -> tuple[Path, Path]:
        """A server certificate for 127.0.0.1 and localhost: (cert, key) PEM files."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "settle test server")]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_file, key_file = directory / "server.pem", directory / "server.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return cert_file, key_file

    def pem(self, path: Path) -> Path:
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v1/operations/k":
            status, body = 200, RECORD
        else:
            status, body = 404, {"type": "about:blank", "title": "not found", "status": 404, "code": "not_found"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json" if status == 200 else "application/problem+json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class TLSServer:
    url: str
    ca_file: Path  # the CA that signed the server's certificate
    other_ca_file: Path  # a CA that did not


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    d = tmp_path_factory.mktemp("tls")
    ca = _CA.make("settle test CA")
    cert_file, key_file = ca.issue(d)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    # Listening once constructed: a client may connect before serve_forever runs.
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    # A failed handshake raises in accept(), which socketserver ignores (an OSError).
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True, name="tls-test-server")
    thread.start()
    try:
        yield TLSServer(
            f"https://127.0.0.1:{httpd.server_address[1]}",
            ca.pem(d / "ca.pem"),
            _CA.make("another CA").pem(d / "other-ca.pem"),
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _unverified(e: BaseException) -> bool:
    return "CERTIFICATE_VERIFY_FAILED" in str(e)


def test_sync_client_trusts_the_given_ca(tls_server: TLSServer) -> None:
    with Client(tls_server.url, verify=str(tls_server.ca_file)) as c:
        rec = c.get("k")
    assert (rec.key, rec.status, rec.lease) == ("k", "running", RECORD["lease"])
    # an os.PathLike and an ssl.SSLContext as well
    with Client(tls_server.url, verify=tls_server.ca_file) as c:
        assert c.get("k").key == "k"
    with Client(tls_server.url, verify=ssl.create_default_context(cafile=tls_server.ca_file)) as c:
        assert c.get("k").key == "k"


def test_sync_client_verifies_the_certificate(tls_server: TLSServer) -> None:
    # The default trust store (httpx's default, verify=True) does not know the test CA.
    with Client(tls_server.url) as c, pytest.raises(TransportError) as default:
        c.get("k")
    assert _unverified(default.value), default.value
    with Client(tls_server.url, verify=str(tls_server.other_ca_file)) as c, pytest.raises(TransportError) as other:
        c.get("k")
    assert _unverified(other.value), other.value
    # verify=False turns verification off, as in httpx
    with Client(tls_server.url, verify=False) as c:
        assert c.get("k").key == "k"


def test_async_client_trusts_the_given_ca_only(tls_server: TLSServer) -> None:
    async def main() -> None:
        async with AsyncClient(tls_server.url, verify=str(tls_server.ca_file)) as c:
            rec = await c.get("k")
            assert (rec.key, rec.status) == ("k", "running")
        async with AsyncClient(tls_server.url) as c:
            with pytest.raises(TransportError) as default:
                await c.get("k")
            assert _unverified(default.value), default.value
        async with AsyncClient(tls_server.url, verify=tls_server.other_ca_file) as c:
            with pytest.raises(TransportError) as other:
                await c.get("k")
            assert _unverified(other.value), other.value

    asyncio.run(main())


def test_a_missing_ca_file_fails_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Client("https://127.0.0.1:1", verify=str(tmp_path / "missing.pem"))
    with pytest.raises(FileNotFoundError):
        AsyncClient("https://127.0.0.1:1", verify=tmp_path / "missing.pem")
    with pytest.raises(TypeError):
        Client("https://127.0.0.1:1", verify=1)  # type: ignore[arg-type]
