"""Writes a benchmark's figures into its own section of docs/benchmarks.md, with the command
that produced them, so the document always says how to reproduce what it shows."""

from __future__ import annotations

import platform
import re
import sys
from datetime import date
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo, else what `platform` says): CPU-s
    figures from different processors differ by tens of percent, so each table names its own."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write_section(name: str, body: str) -> None:
    command = "python " + " ".join(["benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    machine = (
        f"{platform.machine()} {cpu_model()}, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    block = (
        f"<!-- {name}:begin -->\n"
        f"Command: `{command}` ({date.today().isoformat()}, {machine})\n\n"
        f"{body.strip()}\n"
        f"<!-- {name}:end -->"
    )
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- {name}:begin -->.*?<!-- {name}:end -->", re.S)
    text = (
        pattern.sub(lambda _: block, text) if pattern.search(text) else text + "\n" + block + "\n"
    )
    DOC.write_text(text)
    print(f"wrote section {name!r} of {DOC.name}")
