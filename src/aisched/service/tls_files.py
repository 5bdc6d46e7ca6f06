"""What `aisched up` says of its TLS certificate and private key before it serves them.

Checked once, at start (uvicorn reads the files then, and never again):

- a certificate past its end, or before its start, is served anyway with a warning naming the
  file and the date: every client that checks it refuses the connection, but the local socket
  and the clients that trust it by other means still work, and a restart after renewing fixes
  it. A service that refused to start on the day its certificate expired would take the
  socket's users down with it.
- a private key that every user of the machine may read is refused, as the CLI refuses such a
  token file: any local user could pose as the service to its TCP clients and read their
  tokens. One its group may read gets a warning: a group of services that share keys (Debian's
  `ssl-cert`) is often meant.

Standard library only. The certificate is read with CPython's own PEM decoder
(`ssl._ssl._test_decode_cert`, private but there since 3.0): where it is missing, nothing is
said of the dates.
"""

from __future__ import annotations

import os
import ssl
import stat
import time
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TlsFileCheck:
    refusal: str | None = None  # why the files must not be served; None: serve them
    warnings: list[str] = field(default_factory=list)


def check_tls_files(cert: str, key: str, now: float) -> TlsFileCheck:
    """The refusal and warnings for serving `cert` (its first certificate: the server's own)
    and `key` at Unix time `now`. Files that cannot be read are left to the TLS context,
    which says so."""
    warnings = _dates(cert, now)
    try:
        mode = stat.S_IMODE(os.stat(key).st_mode)
    except OSError:
        return TlsFileCheck(None, warnings)
    if mode & stat.S_IROTH:
        return TlsFileCheck(
            f"{key}: the TLS private key is readable by every user of this machine (mode "
            f"{mode:04o}), who could pose as this service; make it private: chmod 600 {key}",
            warnings,
        )
    if mode & stat.S_IRGRP:
        warnings.append(
            f"{key}: the TLS private key is readable by its group (mode {mode:04o}); "
            f"chmod 600 {key} unless that group is meant to read it"
        )
    return TlsFileCheck(None, warnings)


def _dates(cert: str, now: float) -> list[str]:
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return []
    try:
        decoded = decode(cert)
        not_before = ssl.cert_time_to_seconds(decoded["notBefore"])
        not_after = ssl.cert_time_to_seconds(decoded["notAfter"])
    except (OSError, ssl.SSLError, KeyError, ValueError):
        return []
    if now >= not_after:
        return [
            f"{cert}: the TLS certificate expired on {_utc(not_after)}: clients that check it "
            "refuse to connect; renew it and restart"
        ]
    if now < not_before:
        return [
            f"{cert}: the TLS certificate is not valid until {_utc(not_before)}: clients that "
            "check it refuse to connect until then (is this machine's clock right?)"
        ]
    return []


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
