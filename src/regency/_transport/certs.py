"""Certificates for regency's TLS: the per-job CA and leaf derived from a secret, and fresh ones.

A secret determines its job's certificates: Ed25519 keys derived with HKDF-SHA256, fixed names,
serials and dates, so every process that holds the secret derives the same CA (and nobody else
can). :func:`generate_ca_and_leaf` makes random ones for users who bring their own.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
from dataclasses import dataclass

from regency._errors import RegencyError


class TLSSetupError(RegencyError, ValueError):
    """TLS material that cannot be used: missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class Identity:
    """A CA certificate to trust, and the certificate and key to present (all PEM)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def export(self) -> dict[str, bytes]:
        """The identity as plain data (for a proc's bootstrap settings)."""
        return {"ca": self.ca_pem, "cert": self.cert_pem, "key": self.key_pem}


def fingerprint(secret: bytes) -> str:
    """A short public name for ``secret`` (not the secret: a hash of it)."""
    return hashlib.sha256(b"regency tls name" + secret).hexdigest()[:24]


@functools.lru_cache(maxsize=16)
def derived_identity(secret: bytes) -> Identity:
    """The job's CA and leaf certificate, derived from ``secret`` (the same in every process)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def key(label: bytes) -> Ed25519PrivateKey:
        seed = HKDF(hashes.SHA256(), 32, salt=b"regency-tls-v1", info=label).derive(secret)
        return Ed25519PrivateKey.from_private_bytes(seed)

    ca_key, leaf_key = key(b"ca"), key(b"leaf")
    tag = fingerprint(secret)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"regency job CA {tag}")])
    leaf_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"regency job {tag}")])
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    end = datetime.datetime(2200, 1, 1, tzinfo=datetime.timezone.utc)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, None)
    )
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(leaf_name)
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(2)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, None)
    )
    pem = serialization.Encoding.PEM
    return Identity(
        ca_cert.public_bytes(pem),
        leaf_cert.public_bytes(pem),
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def generate_ca_and_leaf(common_name: str = "regency") -> tuple[Identity, bytes]:
    """A fresh random CA and a leaf it signed: the identity, and the CA's private key (PEM).

    For users who want certificates of their own (``REGENCY_TLS_*``) and for tests.
    """
    return leaf_signed_by(None, common_name)


def _pkcs8(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    assert isinstance(key, Ed25519PrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def leaf_signed_by(ca: tuple[bytes, bytes] | None, common_name: str) -> tuple[Identity, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.x509.oid import NameOID

    pem = serialization.Encoding.PEM
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    end = start + datetime.timedelta(days=3650)
    if ca is None:
        ca_key = Ed25519PrivateKey.generate()
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ca_key, None)
        )
    else:
        ca_cert = x509.load_pem_x509_certificate(ca[0])
        loaded = serialization.load_pem_private_key(ca[1], None)
        assert isinstance(loaded, Ed25519PrivateKey)
        ca_key = loaded
    leaf_key = Ed25519PrivateKey.generate()
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, None)
    )
    identity = Identity(
        ca_cert.public_bytes(pem),
        leaf.public_bytes(pem),
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    ca_key_pem = ca_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return identity, ca_key_pem
