"""What a session derives from the running set (`session._running_base`: the running jobs by
id, in the running tuple's order, and the usage of every queue along its path) is the same
whether it follows the ledger's log of views taken and given back (`Holdings`,
`Snapshot.changes`) or is built from the tuple: after any sequence of starts, ends, views
replaced in place and restarts, read after every step or after several, across the log's
restarts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

import aisched.lifecycle.holdings as holdings_mod
from aisched.core.decisions import TaskBinding
from aisched.core.session import _running_base
from aisched.core.snapshot import ZERO, RunningJob, add_usage, build_arrays
from aisched.lifecycle.holdings import Holdings
from aisched.model.queue import Queue, QueueTree
from aisched.testing import cluster, job, node

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["start", "end", "stop", "restart"]), st.integers(0, 30), st.booleans()
    ),
    max_size=60,
)


# Two leaves under one parent, and a queue of its own: usage counts along each path.
QUEUES = QueueTree((Queue("team"), Queue("a", "team"), Queue("b", "team"), Queue("c")))


def _view(n: int, started_s: float) -> RunningJob:
    task = TaskBinding("g0", 0, "n0", (), 0, 100 + n)
    return RunningJob(job(f"j{n}").queue("abc"[n % 3]).task(cpu=0.1).build(), (task,), started_s)


@settings(max_examples=200, deadline=None)
@given(steps=STEPS, limit=st.sampled_from((4, 4096)))
def test_running_by_id_follows_the_log_as_built_from_the_tuple(
    steps: list[tuple[str, int, bool]], limit: int
) -> None:
    arrays = build_arrays(cluster(node("n0").cpus(64)))
    held, queues = Holdings(arrays), QUEUES
    original = holdings_mod.CHANGE_LOG_LIMIT
    holdings_mod.CHANGE_LOG_LIMIT = limit  # a short log: it starts again mid-sequence
    try:
        made = 0
        for what, at, read in steps:
            ids = list(held.views)
            if what == "start" or not ids:
                made += 1
                held.take(_view(made, float(made)))
            else:
                job_id = ids[at % len(ids)]
                if what == "end":
                    held.give(job_id)
                elif what == "stop":  # replaced in place: it keeps its place in the tuple
                    held.update(replace(held.views[job_id], terminating=True))
                else:  # ended and started again: a new attempt comes last
                    old = held.give(job_id)
                    held.take(replace(old, started_s=old.started_s + 1.0, terminating=False))
            if read:
                snapshot = held.snapshot(queues)
                base = _running_base(snapshot)
                assert list(base.by_id.items()) == [(r.id, r) for r in snapshot.running]
                want: dict[str, tuple[float, float, float]] = {}
                for r in snapshot.running:
                    for q in queues.path(r.job.queue):
                        want[q] = add_usage(want.get(q, ZERO), r.usage)
                for q in ("team", "a", "b", "c"):
                    assert base.queue_usage.get(q, ZERO) == want.get(q, ZERO)
    finally:
        holdings_mod.CHANGE_LOG_LIMIT = original
