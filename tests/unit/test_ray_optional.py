"""Ray is an optional extra: without `--ray`, nothing of aisched imports it."""

from __future__ import annotations

import subprocess
import sys


def test_the_service_the_api_and_the_cli_do_not_import_ray() -> None:
    code = (
        "import sys\n"
        "import aisched.cli.main, aisched.cli.up, aisched.service.app, aisched.service.api\n"
        "import aisched.executors.local, aisched.executors.ray_nodes, aisched.executors.ray_task\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
