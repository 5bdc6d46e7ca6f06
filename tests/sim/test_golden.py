"""Golden traces: a small Philly-format trace replayed on a 3-node cluster, whose decision log
and headline figures are kept in `golden/*.json` and must not change unnoticed.

After a deliberate change in scheduling behaviour, regenerate with
`AISCHED_UPDATE_GOLDEN=1 python -m pytest tests/sim/test_golden.py` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aisched.core.policy import preset
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import load_philly
from aisched.testing import cluster, node

GOLDEN = Path(__file__).parent / "golden"
POLICIES = ("fifo", "fifo-backfill", "las", "drf")


def replay(policy: str) -> dict[str, object]:
    trace = load_philly(GOLDEN / "tiny-philly.csv")
    c = cluster(
        node("n1").gpus(8).rack("r1"), node("n2").gpus(8).rack("r1"), node("n3").gpus(8).rack("r2")
    )
    config = SimConfig(checkpoint_interval_s=600.0, restart_cost_s=30.0, validate=True)
    result = simulate(trace, c, preset(policy), config)
    m = compute_metrics(result)
    return {
        "log": [[t, kind, job, list(detail)] for t, kind, job, detail in result.log],
        "metrics": {
            "jobs_finished": m.jobs_finished,
            "avg_jct_s": round(m.avg_jct_s or 0.0, 3),
            "avg_queueing_s": round(m.avg_queueing_s or 0.0, 3),
            "makespan_s": round(m.makespan_s or 0.0, 3),
            "gpu_utilisation": round(m.gpu_utilisation or 0.0, 6),
            "preemptions": m.preemptions,
        },
    }


@pytest.mark.parametrize("policy", POLICIES)
def test_golden_trace(policy: str) -> None:
    got = replay(policy)
    path = GOLDEN / f"tiny-philly.{policy}.json"
    if os.environ.get("AISCHED_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(path.read_text())
    assert got == want
