"""The soak run (aisched.testing.soak): `aisched up` killed with SIGKILL and restarted at
random moments while a few hundred short jobs run; prints jobs, kills, duplicates and lost
(both must be 0) and writes them to docs/benchmarks.md.

    python benchmarks/bench_soak.py [--jobs 300] [--kills 12] [--seed 17]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _report import write_section  # noqa: E402
from _service import free_port  # noqa: E402

from aisched.testing.soak import run_soak  # noqa: E402


def cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--kills", type=int, default=12)
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = run_soak(Path(tmp), jobs=args.jobs, kills=args.kills, seed=args.seed, port=free_port())
    # CPU of this process and the children it waited for (the killed and restarted services;
    # tasks run under supervisors in sessions of their own and are not counted).
    used = cpu_s()
    print(r.line())
    for line in r.problems:
        print(f"  {line}")
    body = (
        "| jobs | kills (SIGKILL of `aisched up`) | duplicates | lost | final states | "
        "CPU-seconds (driver and services) |\n| --- | --- | --- | --- | --- | --- |\n"
        f"| {r.jobs} | {r.kills} | {r.duplicates} | {r.lost} | "
        f"{', '.join(f'{k} {v}' for k, v in sorted(r.states.items()))} | {used:.0f} |\n\n"
        "Each job appends one line to a file of its own after its work; a duplicate is a job "
        "with two lines or a submission key that made two jobs, a lost one a job that did not "
        "succeed or left no line. Submissions carry an Idempotency-Key and are sent again "
        "with it when the service was killed before it answered."
    )
    if not args.no_write:
        write_section("soak", body)
    if r.duplicates or r.lost:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
