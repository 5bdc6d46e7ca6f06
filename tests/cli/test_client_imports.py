"""Client commands start light: running one (here against a server that is not there) imports
neither numpy nor the core, the simulator, the store, the server or scikit-learn. Checked in a
fresh interpreter, since this test process has imported everything already. (`run` checks its
flags with the spec's unit parsers, which bring in pydantic; that is allowed.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("numpy", "aisched.core", "aisched.sim", "aisched.store", "fastapi", "sklearn")

PROBE = """
import json, sys
from aisched.cli.main import main
status = main(sys.argv[1:])
heavy = sorted({m.split(".")[0] if not m.startswith("aisched.") else ".".join(m.split(".")[:2])
                for m in sys.modules} & set(json.loads(sys.stdin.read())))
print(json.dumps({"status": status, "heavy": heavy}))
"""


def _probe(*argv: str, home: Path | None = None) -> dict[str, object]:
    # Nothing of this machine's may answer: no service of its own (AISCHED_HOME), none named
    # in the environment. (The system socket is not consulted once a server is named.)
    env = {**os.environ, "AISCHED_SERVER": NOWHERE}
    if home is not None:
        env["AISCHED_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        input=json.dumps(HEAVY),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


# Port 9 (discard) on loopback: nothing listens there, so each command fails to connect.
NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    "argv",
    [
        ("jobs",),
        ("jobs", "--all", "--json"),
        ("show", "1"),
        ("cancel", "1", "2"),
        ("logs", "1"),
        ("run", "--gpus", "1", "--mem", "2G", "--", "true"),
        ("nodes",),
        ("queues",),
    ],
)
def test_a_client_command_imports_nothing_heavy(argv: tuple[str, ...], tmp_path: Path) -> None:
    # --server before the subcommand: after `run ... --` it would be part of the job's command.
    assert _probe("--server", NOWHERE, *argv, home=tmp_path) == {"status": 1, "heavy": []}


def test_the_probe_sees_heavy_imports() -> None:
    """The check can fail: the simulator's command does import them."""
    out = _probe("simulate", "--trace", "no-such-trace")
    assert out["status"] == 2 and out["heavy"] == ["aisched.core", "aisched.sim", "numpy"]
