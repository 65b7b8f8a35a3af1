"""The operator's one command for the federation's TLS files and site keys."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from flowerapp.certs import main


def test_the_superlink_certificate_is_signed_by_the_ca_for_the_hosts_sites_dial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--out", str(tmp_path), "--host", "hub.example.org", "--host", "10.0.0.5"]
    assert main([*argv, "--site", "hospital-a"]) == 0
    written = capsys.readouterr().out.split()
    assert {Path(p).name for p in written} == {
        "ca.crt", "ca.key", "server.pem", "server.key", "hospital-a.key", "hospital-a.pub"
    }  # fmt: skip

    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["hub.example.org"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]

    # private keys are the owner's alone; the site key is what flower-supernode reads
    for secret in ("ca.key", "server.key", "hospital-a.key"):
        assert (tmp_path / secret).stat().st_mode & 0o077 == 0
    serialization.load_ssh_private_key((tmp_path / "hospital-a.key").read_bytes(), None)
    assert (tmp_path / "hospital-a.pub").read_text().startswith("ecdsa-sha2-nistp384 ")


def test_existing_keys_are_not_replaced_without_force_and_bad_names_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path), "--no-tls", "--site", "a"]) == 0
    before = (tmp_path / "a.key").read_bytes()
    assert main(["--out", str(tmp_path), "--no-tls", "--site", "a"]) == 1
    assert (tmp_path / "a.key").read_bytes() == before  # the site is not locked out
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("a.key exists (pass overwrite=True / --force to replace it)")
    )
    assert main(["--out", str(tmp_path), "--no-tls", "--site", "a", "--force"]) == 0
    assert (tmp_path / "a.key").read_bytes() != before

    assert main(["--out", str(tmp_path), "--no-tls", "--site", "../x"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: site name '../x' must match") and "\n" not in error
