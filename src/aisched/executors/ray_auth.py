"""Whether a Ray cluster asks for its token: Ray's own API (its GCS, raylets, dashboard) runs
what it is sent with the workers' privileges, and aisched's workers on a shared cluster run as
root (to start each task as its user). Without Ray's token authentication (`RAY_AUTH_MODE=
token`, Ray 2.52 or later) any local user of a machine that reaches those ports could join a
node of their own, or call aisched's node agents, and run commands as root or as another user.

`open_to_anyone` asks the cluster's GCS for a key from a child process that holds no token (no
`RAY_AUTH_*` variable, a home without `~/.ray/auth_token`): the cluster is open when it answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

PROBE_TIMEOUT_S = 30.0

_PROBE = """
import sys
from ray._raylet import GcsClient
address = sys.argv[1]
if address == "auto":
    from ray._private.services import canonicalize_bootstrap_address_or_die
    address = canonicalize_bootstrap_address_or_die("auto")
try:
    GcsClient(address=address).internal_kv_get(b"aisched-auth-probe", None, timeout=10)
except Exception as e:
    print(f"refused: {type(e).__name__}: {str(e)[:300]}")
    sys.exit(3)
print("open")
"""


class RayAuthUnknown(RuntimeError):
    """The probe could not tell (it neither got an answer nor a refusal for lack of a token)."""


def open_to_anyone(address: str) -> bool:
    """True when the GCS at `address` (`host:port`, or `auto`) answers a client with no token;
    False when it refuses it for that. Raises RayAuthUnknown otherwise, saying why."""
    with tempfile.TemporaryDirectory(prefix="aisched-ray-probe-") as home:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,  # no ~/.ray/auth_token there
            "RAY_AUTH_MODE": "disabled",
        }
        try:
            r = subprocess.run(
                [sys.executable, "-c", _PROBE, address],
                env=env,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise RayAuthUnknown(f"no answer within {PROBE_TIMEOUT_S:g} s") from None
    if r.returncode == 0 and r.stdout.strip() == "open":
        return True
    said = r.stdout.strip() or (r.stderr.strip().splitlines() or ["nothing"])[-1]
    if "AuthenticationError" in said or "InvalidAuthToken" in said:
        return False
    raise RayAuthUnknown(said)
