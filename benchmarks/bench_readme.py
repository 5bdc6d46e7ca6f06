"""The README's simulate command, run exactly as the README writes it, and its output put back
into the README, so the figures the README prints are the ones this script measured and cannot
drift from what the command does.

The command is the one-line `sh` block just before the `<!-- readme-simulate:begin -->` marker
of README.md; it runs as a subprocess (the `aisched` next to this Python). The output replaces
what lies between the markers (the per-queue table cut after its second queue), with the CPU
time of the whole command (user + system, trace loading included: wall times on these shared
machines are noisy). The same figures go into docs/benchmarks.md.

    python benchmarks/bench_readme.py [--no-write]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- readme-simulate:begin -->", "<!-- readme-simulate:end -->"
_COMMAND = re.compile(r"```sh\n(aisched simulate [^\n]*)\n```\s*\n" + re.escape(BEGIN))
_REGION = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)


def readme_command(text: str) -> str:
    m = _COMMAND.search(text)
    if m is None:
        raise SystemExit(
            f"README.md: no one-line `sh` block with `aisched simulate` before {BEGIN}"
        )
    return m.group(1)


def run(command: str) -> tuple[str, float, float]:
    """The command's stdout, its CPU seconds (user + system) and wall seconds."""
    argv = shlex.split(command)
    argv[0] = str(Path(sys.executable).with_name("aisched"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{command}: exit {done.returncode}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout, cpu, wall


def cut_queue_table(out: str, policies: int) -> str:
    """The output up to the second queue's first row of the per-queue table, then `...`."""
    lines = out.rstrip("\n").split("\n")
    start = next(i for i, line in enumerate(lines) if line.strip() == "per queue")
    # title, top border, header, header rule, then each queue's rows and a rule between queues
    keep = start + 4 + policies + 1 + 1
    last = lines[keep - 1]
    dots = re.sub(r"(?<=│)[^│]+", lambda m: " ..." + " " * (len(m.group(0)) - 4), last)
    # Only the first column names the queue: the others read "..." in the queue column only.
    cells = dots.split("│")
    dots = "│".join(c if i <= 1 else " " * len(c) for i, c in enumerate(cells))
    return "\n".join([*lines[:keep], dots])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="print only; leave the docs alone")
    args = ap.parse_args()
    text = README.read_text()
    command = readme_command(text)
    policies = len(re.search(r"--policy (\S+)", command).group(1).split(","))  # type: ignore[union-attr]
    print(f"running: {command}", flush=True)
    out, cpu, wall = run(command)
    shown = cut_queue_table(out, policies)
    print(shown)
    print(f"{cpu:.1f} CPU-s, {wall:.1f} s wall", flush=True)
    intro = textwrap.fill(
        f"prints (one run on a 2-core machine, {cpu:.0f} CPU-seconds for the whole command as "
        "measured by `benchmarks/bench_readme.py`; wall times vary, the rest do not: the "
        "simulator is deterministic). The per-queue table goes on for every queue:",
        width=96,
    )
    region = f"{BEGIN}\n{intro}\n```\n{shown}\n```\n{END}"
    if args.no_write:
        return
    README.write_text(_REGION.sub(lambda _: region, text))
    print("wrote README.md")
    write_section(
        "readme",
        f"`{command}`: {cpu:.1f} CPU-seconds (user + system, trace loading included), "
        f"{wall:.1f} s wall.\n\n```\n{shown}\n```",
    )


if __name__ == "__main__":
    main()
