"""The soak test (about 2 minutes): a few hundred short jobs while `aisched up` is killed with
SIGKILL and restarted a dozen times at random moments; every job ends exactly once, counted by
the side effect each one writes (aisched.testing.soak; benchmarks/bench_soak.py prints the
same figures into docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

from harness import free_port

from aisched.testing.soak import run_soak


def test_every_job_ends_exactly_once_across_a_dozen_kill_9s(tmp_path: Path) -> None:
    r = run_soak(tmp_path, jobs=300, kills=12, seed=17, port=free_port(), timeout_s=400)
    print(r.line())
    assert (r.jobs, r.kills, r.duplicates, r.lost, r.problems) == (300, 12, 0, 0, [])
    assert r.states == {"succeeded": 300}
