"""What `limits.user_max_ended_bytes` costs the service: the ledger of every ended job's size is
kept in memory and measured again at every start (`service/ended_bytes.py`), so both grow with
the ended jobs kept (`limits.keep_ended`). Makes N ended jobs' folders as a service leaves them
(a job's `logs/JOB/1/main-0.log` of 1 KiB and its exit record, `tasks/JOB/main-0.json`) for
100 users in a temporary data directory, then prints the CPU seconds of the start's measuring
(the files just written, so in the page cache: a cold disk adds its reads) in steps of
`MEASURE_AT_MOST`, and of the start's one query for the ended jobs' document sizes (SQLite),
the ledger's memory (tracemalloc), and the CPU microseconds a step pays for one job that ended
(measured, and its user's oldest forgotten). Writes them into docs/benchmarks.md.

    python benchmarks/bench_ended_bytes.py [--jobs 10000,100000] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

from aisched.service.ended_bytes import MEASURE_AT_MOST, Ended, EndedBytes  # noqa: E402
from aisched.store.db import Store  # noqa: E402

USERS = 100


def make_jobs(data: Path, first: int, n: int) -> list[Ended]:
    ended = []
    for seq in range(first, first + n):
        job_id = str(seq)
        attempt = data / "logs" / job_id / "1"
        attempt.mkdir(parents=True)
        (attempt / "main-0.log").write_bytes(b"x" * 1024)
        (attempt / "main-0.log.exit.json").write_text('{"exit_code": 0}')
        tasks = data / "tasks" / job_id
        tasks.mkdir(parents=True)
        (tasks / "main-0.json").write_text("{}")
        ended.append(Ended(job_id, f"user{seq % USERS}", 600))
    return ended


def stored(data: Path, ended: list[Ended]) -> Store:
    """A store holding `ended` as ended jobs (documents of about 600 bytes)."""
    store = Store(f"sqlite:///{data / 'state.db'}")
    spec = {"command": ["python", "train.py", "--epochs", "10"], "env": {"X": "y" * 500}}
    rows = [
        {
            "seq": int(e.job_id),
            "id": e.job_id,
            "name": "train",
            "user": e.user,
            "queue": "default",
            "priority": 0,
            "kind": "batch",
            "format": "native",
            "spec": spec,
            "state": "succeeded",
            "submitted_at": 1.0,
            "finished_at": float(e.job_id),
            "attempt": 1,
            "failures": 0,
            "preemptions": 0,
            "attained_gpu_s": 0.0,
            "checkpoint_dir": "/c",
        }
        for e in ended
    ]
    with store.tx() as tx:
        tx.insert_jobs(rows)
    return store


def measure_all(ledger: EndedBytes, newest_id: str) -> int:
    """Steps until every ended job is measured."""
    steps = 0
    while ledger.to_measure:
        ledger.over(newest_id, 500)
        steps += 1
    return steps


def measure(n: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        ended = make_jobs(data, 1, n)
        store = stored(data, ended)
        start = time.process_time()
        with store.read() as tx:
            sizes = [Ended(*row) for row in tx.ended_doc_sizes()]
        query_s = time.process_time() - start
        store.close()
        assert len(sizes) == n
        ledger = EndedBytes(data, 1 << 60)  # nothing forgotten while measuring
        start = time.process_time()
        ledger.recover(sizes)
        measuring = measure_all(ledger, str(n))
        recover_s = time.process_time() - start
        tracemalloc.start()  # on a second start: it slows what it traces
        ledger.recover(sizes)
        measure_all(ledger, str(n))
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        # A bound the jobs already fill (all alike): each new one forgets its user's oldest.
        ledger.most = max(ledger.per_user.values())
        steps = 200
        more = make_jobs(data, n + 1, steps)
        start = time.process_time()
        forgot = 0
        for e in more:
            ledger.ended(e.job_id, e.user, sizes[0].doc_bytes)  # as large as the others'
            forgot += sum(len(ids) for ids in ledger.over(str(n + steps), 500).values())
        step_us = (time.process_time() - start) / steps * 1e6
        assert forgot == steps, forgot  # each new job took its user's oldest
    row = (
        f"| {n:,} | {query_s:.2f} | {recover_s:.2f} ({measuring:,} steps, "
        f"{recover_s / measuring * 1e3:.0f} ms each) | {held / 2**20:.1f} | {held / n:.0f} | {step_us:.0f} |"
    )
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="10000,100000", help="ended jobs kept, comma-separated")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    header = (
        "| ended jobs kept | their document sizes at start (CPU-s) | measuring their files "
        f"after a start, {MEASURE_AT_MOST:,} a step (CPU-s) | ledger (MiB) | per job (bytes) "
        "| a job ending, measured and its user's oldest forgotten (CPU µs) |\n"
        "| ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    print(header)
    rows = [measure(int(n)) for n in args.jobs.split(",")]
    if not args.no_write:
        write_section("ended-bytes", header + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
