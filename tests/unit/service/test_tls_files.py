"""What `aisched up` says of its TLS files at start, on real certificates made by openssl: a
certificate out of its dates is served with a warning naming it and the date, a key every user
may read is refused, one its group may read is warned of."""

from __future__ import annotations

import ssl
import subprocess
import time
from pathlib import Path

import pytest

from aisched.service.tls_files import TlsFileCheck, check_tls_files


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A certificate valid for a day, its key (0600), and the same one expired yesterday."""
    cert, key, expired = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "old.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-signkey", str(key), "-days", "-1",
         "-out", str(expired)],
        check=True, capture_output=True,
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key, expired


def dates(cert: Path) -> tuple[float, float]:
    decoded = ssl._ssl._test_decode_cert(str(cert))  # type: ignore[attr-defined]
    return (
        ssl.cert_time_to_seconds(decoded["notBefore"]),
        ssl.cert_time_to_seconds(decoded["notAfter"]),
    )


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def test_a_certificate_out_of_its_dates_is_named_with_the_date(
    files: tuple[Path, Path, Path],
) -> None:
    cert, key, expired = files
    start, end = dates(cert)
    assert check_tls_files(str(cert), str(key), start + 60) == TlsFileCheck()
    assert check_tls_files(str(expired), str(key), start + 60) == TlsFileCheck(
        warnings=[
            f"{expired}: the TLS certificate expired on {utc(dates(expired)[1])}: clients that "
            "check it refuse to connect; renew it and restart"
        ]
    )
    assert check_tls_files(str(cert), str(key), start - 3600) == TlsFileCheck(
        warnings=[
            f"{cert}: the TLS certificate is not valid until {utc(start)}: clients that check "
            "it refuse to connect until then (is this machine's clock right?)"
        ]
    )


def test_a_key_others_may_read_is_refused_and_one_its_group_may_read_is_warned_of(
    files: tuple[Path, Path, Path],
) -> None:
    cert, key, _ = files
    now = dates(cert)[0] + 60
    key.chmod(0o644)
    assert check_tls_files(str(cert), str(key), now) == TlsFileCheck(
        refusal=f"{key}: the TLS private key is readable by every user of this machine (mode "
        f"0644), who could pose as this service; make it private: chmod 600 {key}"
    )
    key.chmod(0o640)
    assert check_tls_files(str(cert), str(key), now) == TlsFileCheck(
        warnings=[
            f"{key}: the TLS private key is readable by its group (mode 0640); chmod 600 {key} "
            "unless that group is meant to read it"
        ]
    )
