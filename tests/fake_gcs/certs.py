"""A throwaway certificate authority, made at test time, for the proxy's TLS.

TensorFlow's gs:// client checks the server's certificate against `CURL_CA_BUNDLE`:
pointing that at this CA's certificate lets the proxy answer as Google's hosts
without any certificate leaving the test run (nothing is stored in the repository).
"""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_certificates(directory: Path, hosts: list[str]) -> tuple[Path, Path, Path]:
    """Makes a CA and one certificate for all `hosts`, signed by it, in `directory`.

    Returns the paths of the CA certificate (for `CURL_CA_BUNDLE`), of the host
    certificate and of its key (for `server_context`).
    """
    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)

    # P-256 keys: made in milliseconds, and accepted by TensorFlow's BoringSSL.
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tpurun test CA"))
        .issuer_name(_name("tpurun test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    host_key = ec.generate_private_key(ec.SECP256R1())
    host_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(host_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_to)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    chain_path, key_path = directory / "host.pem", directory / "host-key.pem"
    chain_path.write_bytes(host_cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pem(host_key))
    return ca_path, chain_path, key_path


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """A server-side TLS context that presents the host certificate and speaks HTTP/1.1 only."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    # No HTTP/2: the proxy parses HTTP/1.1, and libcurl falls back to it when offered only that.
    context.set_alpn_protocols(["http/1.1"])
    return context
