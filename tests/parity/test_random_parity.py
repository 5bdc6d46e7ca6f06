"""Parity on random traces: the simulator and the live service agree on every small trace.

The cases are drawn by `random_cases.random_case` (gangs, elastic jobs, priorities, grace
periods, played failures with retries and backoff, preemption, on 2 or 3 nodes; what it never
draws, and why, is said there) and run through both drivers (`drivers.py`); the decision logs
must be equal. Hypothesis shrinks a disagreement to a small case, which then belongs in
`test_parity.py` as a hand-written one, with its cause fixed.

Repeatable in CI: a fixed number of examples, derandomized (the same cases on every run). A
larger run by hand, with fresh cases each time: `AISCHED_PARITY_EXAMPLES=2000 pytest -k
random_parity`; and `python tests/parity/test_random_parity.py SEED COUNT` counts how many of
COUNT seeded traces agree, printing the seeds that do not.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

from drivers import live_log, show, sim_log
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_cases import random_case

_BY_HAND = os.environ.get("AISCHED_PARITY_EXAMPLES")


@settings(
    max_examples=int(_BY_HAND) if _BY_HAND else 50,
    derandomize=_BY_HAND is None,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_traces_give_one_decision_log(data: st.DataObject) -> None:
    case = random_case(lambda options: data.draw(st.sampled_from(options)))
    want = sim_log(case)
    with tempfile.TemporaryDirectory() as home:
        got = live_log(case, Path(home))
    assert got == want, f"{case}\nlive:\n{show(got)}\nsim:\n{show(want)}"


def count_agreeing(first_seed: int, count: int) -> list[int]:
    """The seeds in `first_seed`..+`count` whose traces the two drivers disagree on."""
    differ = []
    for seed in range(first_seed, first_seed + count):
        case = random_case(random.Random(seed).choice, f"seed {seed}")
        with tempfile.TemporaryDirectory() as home:
            if live_log(case, Path(home)) != sim_log(case):
                differ.append(seed)
    return differ


if __name__ == "__main__":
    first, n = int(sys.argv[1]), int(sys.argv[2])
    bad = count_agreeing(first, n)
    print(f"{n - len(bad)} of {n} traces agree; seeds that differ: {bad}")
