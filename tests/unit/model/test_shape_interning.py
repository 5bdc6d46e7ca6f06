"""Shape interning (`Job.shape_id`) and the cluster memo stay bounded in a long-running
service, and a shape's id is never reused while a cache might still hold it."""

from __future__ import annotations

import gc

from aisched.core.snapshot import BoundedMemo
from aisched.model import job as job_mod
from aisched.testing import job


def test_equal_shapes_share_an_id_and_different_ones_do_not() -> None:
    a = job("a").task(2, gpu=1).build()
    b = job("b").task(2, gpu=1).priority(5).build()
    c = job("c").task(3, gpu=1).build()
    assert (a.shape_id == b.shape_id, a.shape_id == c.shape_id) == (True, False)
    assert a.shape == b.shape


def test_shapes_of_gone_jobs_are_dropped_and_their_ids_never_come_back() -> None:
    jobs = [job(f"j{i}").task(1, cpu=1 + i, mem_gib=777).build() for i in range(200)]
    old_ids = {j.shape_id for j in jobs}
    keys = [j.shape for j in jobs]
    assert len(old_ids) == 200
    assert sum(k in job_mod._SHAPES for k in keys) == 200
    del jobs
    gc.collect()
    assert sum(k in job_mod._SHAPES for k in keys) == 0
    again = [job(f"k{i}").task(1, cpu=1 + i, mem_gib=777).build() for i in range(200)]
    assert {j.shape_id for j in again} & old_ids == set()


def test_the_memo_keeps_at_most_its_limit_dropping_the_oldest() -> None:
    memo = BoundedMemo(limit=3)
    for k in "abcde":
        memo[k] = k.upper()
    assert dict(memo) == {"c": "C", "d": "D", "e": "E"}
    memo["d"] = "d2"  # replacing an entry drops nothing
    assert memo.setdefault("f", "F") == "F"
    assert dict(memo) == {"d": "d2", "e": "E", "f": "F"}
