"""TLS certificates and SuperNode keys for a Flower federation, made with `cryptography`.

One command gives an operator everything a SuperLink and its sites need:

    python -m flowerapp.certs --out certs --host hub.example.org --host 10.0.0.5 \\
        --site hospital-a --site hospital-b

It writes
- ``ca.crt``/``ca.key``: a self-signed CA. ``ca.crt`` goes to every SuperNode
  (``flower-supernode --root-certificates``) and to the ``flwr`` CLI config
  (``root-certificates``); ``ca.key`` stays offline with the operator.
- ``server.pem``/``server.key``: the SuperLink certificate, signed by the CA, valid for the
  ``--host`` names and IP addresses (``flower-superlink --ssl-ca-certfile ca.crt
  --ssl-certfile server.pem --ssl-keyfile server.key``).
- ``<site>.key``/``<site>.pub``: one EC P-384 key pair per ``--site``. The private key stays
  on the site (``flower-supernode --auth-supernode-private-key <site>.key``); the public key
  is registered on the SuperLink (``flwr supernode register <site>.pub``), which only admits
  registered keys when started with ``--enable-supernode-auth``.

Private keys are written with mode 0600 and never overwritten unless asked (``--force``):
replacing a site key silently would lock the site out of the federation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("127.0.0.1", "localhost")
DEFAULT_DAYS = 365
_SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA and the SuperLink server certificate (all PEM)."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class SiteKey:
    """A site's SuperNode authentication key pair: OpenSSH private key and public key."""

    name: str
    private: Path
    public: Path


def _write(path: Path, data: bytes, *, secret: bool, overwrite: bool) -> None:
    """Write one file; secrets are created with mode 0600 so they are never world-readable."""
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists (pass overwrite=True / --force to replace it)")
    mode = 0o600 if secret else 0o644
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)  # O_CREAT honours the umask; the mode must not depend on it
    tmp.replace(path)


def _pkcs8(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PEM, PKCS8, unencrypted: what gRPC reads for a TLS server key."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    """SubjectAlternativeName: IP literals as IPAddress entries, the rest as DNS names."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    validity: tuple[dt.datetime, dt.datetime],
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """What the CA and the SuperLink certificate share: names, validity, key identifier,
    and their roles (a CA signs certificates; a server signs its TLS handshakes)."""
    usage = x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def make_tls(
    out_dir: Path,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    *,
    days: int = DEFAULT_DAYS,
    overwrite: bool = False,
) -> TlsFiles:
    """Write a self-signed CA and a SuperLink certificate it signs, valid for `hosts`.

    gRPC checks the server certificate's SubjectAlternativeName against the address a client
    dials, so every name or IP a SuperNode or the `flwr` CLI uses must be in `hosts`.
    """
    if not hosts:
        raise ValueError("at least one host is needed for the server certificate")
    out_dir.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    validity = (now - dt.timedelta(minutes=5), now + dt.timedelta(days=days))

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsieve Flower CA")])
    ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), validity, ca=True).sign(
        ca_key, hashes.SHA384()
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    server_cert = (
        _certificate(server_name, ca_name, server_key.public_key(), validity, ca=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(hosts), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA384())
    )

    files = TlsFiles(
        ca_cert=out_dir / "ca.crt",
        ca_key=out_dir / "ca.key",
        server_cert=out_dir / "server.pem",
        server_key=out_dir / "server.key",
    )
    pem = serialization.Encoding.PEM
    _write(files.ca_key, _pkcs8(ca_key), secret=True, overwrite=overwrite)
    _write(files.ca_cert, ca_cert.public_bytes(pem), secret=False, overwrite=overwrite)
    _write(files.server_key, _pkcs8(server_key), secret=True, overwrite=overwrite)
    _write(files.server_cert, server_cert.public_bytes(pem), secret=False, overwrite=overwrite)
    return files


def make_site_key(out_dir: Path, name: str, *, overwrite: bool = False) -> SiteKey:
    """Write a site's EC P-384 key pair in the formats Flower 1.32 reads.

    `flower-supernode --auth-supernode-private-key` loads the key with
    `load_ssh_private_key`, so the private key is in OpenSSH format (what
    `ssh-keygen -t ecdsa -b 384` writes; a PKCS8 PEM key is refused with "Unable to parse the
    private key file."). `flwr supernode register` loads the public key with
    `load_ssh_public_key`: one `ecdsa-sha2-nistp384 ...` line.
    """
    if not _SITE_NAME.fullmatch(name):
        raise ValueError(f"site name {name!r} must match {_SITE_NAME.pattern}")
    out_dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    site = SiteKey(name=name, private=out_dir / f"{name}.key", public=out_dir / f"{name}.pub")
    _write(site.private, private, secret=True, overwrite=overwrite)
    _write(site.public, public + f" {name}\n".encode(), secret=False, overwrite=overwrite)
    return site


def main(argv: Sequence[str] | None = None) -> int:
    """Operator CLI: write the TLS files and one key pair per --site into --out."""
    parser = argparse.ArgumentParser(
        prog="python -m flowerapp.certs",
        description="Write a CA, a SuperLink TLS certificate and SuperNode key pairs.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="H",
        help="SuperLink DNS name or IP for the certificate (repeat; default: 127.0.0.1 "
        "and localhost)",
    )
    parser.add_argument(
        "--site",
        action="append",
        dest="sites",
        default=[],
        metavar="NAME",
        help="write NAME.key/NAME.pub for one SuperNode (repeat)",
    )
    parser.add_argument("--no-tls", action="store_true", help="only write site key pairs")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)

    written: list[Path] = []
    try:
        if not args.no_tls:
            tls = make_tls(args.out, tuple(args.hosts or DEFAULT_HOSTS), overwrite=args.force)
            written += [tls.ca_cert, tls.ca_key, tls.server_cert, tls.server_key]
        for name in args.sites:
            site = make_site_key(args.out, name, overwrite=args.force)
            written += [site.private, site.public]
    except (FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
