"""Certificates for the security tests: a CA and the leaves it signs,
written as PEM files (Kafka's PEM keystore and truststore layouts), and
as PKCS12 stores written by Java's own keytool."""
from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path

import pytest

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class Pki:
    """A CA, and certificates it signs, written as PEM files in `dir`."""

    def __init__(self, dir: Path):
        self.dir = dir
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = (x509.CertificateBuilder().subject_name(_name("keel-test-ca")).issuer_name(_name("keel-test-ca"))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(NOW - datetime.timedelta(days=1))
                     .not_valid_after(NOW + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.ca = self._write("ca.pem", self.cert.public_bytes(serialization.Encoding.PEM))

    def _write(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)

    def leaf(self, cn: str, server: bool, expired: bool = False, password: bytes | None = None,
             client_too: bool = False) -> tuple[str, str]:
        """-> (certificate file, key file); the server's also holds its key
        (Kafka's PEM keystore: key and chain in one file), encrypted with
        `password` if given; `client_too`: a server's that is also a
        client's (a broker's, which connects to other brokers)."""
        key = ec.generate_private_key(ec.SECP256R1())
        end = NOW - datetime.timedelta(hours=1) if expired else NOW + datetime.timedelta(days=1)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server and client_too:
            usage.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        encryption = (serialization.BestAvailableEncryption(password) if password
                      else serialization.NoEncryption())
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        cert_file = self._write(f"{cn}.crt", cert_pem)
        key_file = self._write(f"{cn}.key", key_pem)
        if server:
            self._write(f"{cn}.pem", key_pem + cert_pem)
        return cert_file, key_file

    def pkcs12(self, cn: str, password: str) -> tuple[str, str]:
        """-> (keystore, truststore): `cn`'s server key and chain, and the
        CA, as PKCS12 stores Java's keytool wrote (its algorithms, as a
        Kafka operator's stores have them), both with `password`."""
        keytool = shutil.which("keytool")
        if keytool is None:
            pytest.skip("`keytool` (a JDK) is not on PATH")
        self.leaf(cn, server=True)
        key = serialization.load_pem_private_key((self.dir / f"{cn}.key").read_bytes(), None)
        cert = x509.load_pem_x509_certificate((self.dir / f"{cn}.crt").read_bytes())
        made = pkcs12.serialize_key_and_certificates(cn.encode(), key, cert, [self.cert],
                                                     serialization.BestAvailableEncryption(password.encode()))
        self._write(f"{cn}-made.p12", made)
        keystore, truststore = self.dir / f"{cn}.p12", self.dir / f"{cn}-trust.p12"
        for args in (["-importkeystore", "-srckeystore", str(self.dir / f"{cn}-made.p12"), "-srcstoretype", "PKCS12",
                      "-srcstorepass", password, "-destkeystore", str(keystore), "-deststoretype", "PKCS12",
                      "-deststorepass", password],
                     ["-importcert", "-alias", "ca", "-file", self.ca, "-keystore", str(truststore),
                      "-storetype", "PKCS12", "-storepass", password]):
            subprocess.run([keytool, *args, "-noprompt"], check=True, capture_output=True, timeout=60)
        return str(keystore), str(truststore)
