"""End to end: an elastic training job on the real service, driven by the real CLI.

The job starts at its maximum (all four GPUs). A job of the same priority arrives: nobody may
be evicted for it, so the elastic job is shrunk instead: stopped with SIGTERM (it checkpoints),
restarted from its checkpoint with two tasks, and the new job runs on the two GPUs given up.
Once the new job has finished, the elastic job grows back to four. Tasks write what they see to
a log in the work directory; every wait polls with a generous deadline.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Service, local_service, wait_for

PY = sys.executable

# Each task appends "start RANK WORLD_SIZE RESTART STEP GPUS" to ranks.log, counts steps until
# `release-train` exists (marking its 5th and 300th steps with a file: the 300th comes after at
# least 6 s of sleeps), and on SIGTERM saves its step (rank 0: the checkpoint) and exits 0.
TRAIN = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    rank, world = int(os.environ["RANK"]), os.environ["WORLD_SIZE"]
    ckpt = pathlib.Path(os.environ["AISCHED_CHECKPOINT_DIR"]) / "step"
    step = int(ckpt.read_text()) if ckpt.exists() else 0
    with open("ranks.log", "a") as f:
        f.write(f"start {rank} {world} {os.environ['AISCHED_RESTART_COUNT']} {step} "
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}\\n")
    def term(*_):
        if rank == 0:
            ckpt.write_text(str(step))
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    while not os.path.exists("release-train"):
        step += 1
        if step in (5, 300):
            open(f"stepped-{step}-{rank}-{os.environ['AISCHED_RESTART_COUNT']}", "w").close()
        time.sleep(0.02)
    """
)

ELASTIC = textwrap.dedent(
    f"""
    name: elastic-train
    priority: 0
    elastic: true
    min_available: 1
    grace_period: 20s
    replicas: 4
    command: [{PY}, train.py]
    resources: {{cpus: 0.5, mem: 512M, gpus: 1}}
    """
)

CONFIG = "elastic_grow_after: 3s\ncycle_interval: 1s\n"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with local_service(tmp_path, CONFIG) as svc:
        yield svc


def starts(service: Service) -> list[list[str]]:
    path = service.work / "ranks.log"
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines()]


def attempt_with(service: Service, job_id: str, attempt: int, tasks: int) -> Any:
    """The job's view once its `attempt` runs `tasks` tasks, all started (else None)."""
    j = service.job(job_id)
    restarts = [s for s in starts(service) if s[3] == str(attempt - 1)]
    ok = (
        j["state"] == "running"
        and j["attempt"] == attempt
        and j["running_tasks"] == tasks
        and len(restarts) == tasks
    )
    return j if ok else None


def test_an_elastic_job_shrinks_for_an_equal_priority_job_then_grows_back(
    service: Service,
) -> None:
    (service.work / "train.py").write_text(TRAIN)
    (service.work / "elastic.yaml").write_text(ELASTIC)
    el = str(service.cli_json("submit", "elastic.yaml")["id"])
    # 1. At its maximum: four tasks, world size 4, each with its own GPU.
    first = wait_for("four tasks", lambda: attempt_with(service, el, 1, 4), 30)
    assert (first["elastic"], first["min_tasks"], first["max_tasks"]) == (True, 1, 4)
    assert sorted(s[1:3] for s in starts(service)) == [[str(r), "4"] for r in range(4)]
    wait_for("rank 0 to train a few steps", (service.work / "stepped-5-0-0").exists, 30)

    # 2. A job of the same priority asks for two GPUs: the elastic job gives them up.
    other = service.run(
        "--gpus", "2", "--cpus", "1", "--mem", "512M", "--priority", "0", "--name", "other",
        "--", PY, "-c",
        "import os, time\nwhile not os.path.exists('release-other'): time.sleep(0.05)",
    )  # fmt: skip
    assert service.wait_state(other, "running", timeout_s=45)["state"] == "running"
    shrunk = wait_for("two tasks", lambda: attempt_with(service, el, 2, 2), 45)
    assert (shrunk["preemptions"], shrunk["failures"]) == (0, 0)  # kept running, not evicted
    assert [t["name"] for t in shrunk["tasks"]] == ["main-0", "main-1"]
    kinds = [e["kind"] for e in shrunk["events"]]
    assert "shrinking" in kinds and "shrunk" in kinds and "preempted" not in kinds
    second = [s for s in starts(service) if s[3] == "1"]
    assert sorted(s[2] for s in second) == ["2", "2"]  # restarted with world size 2
    assert all(int(s[4]) > 0 for s in second if s[1] == "0")  # from its checkpoint
    held = {g for t in shrunk["tasks"] for g in t["gpus"]}
    other_gpus = {g for t in service.job(other)["tasks"] for g in t["gpus"]}
    assert len(held) == 2 and len(other_gpus) == 2 and not held & other_gpus
    assert "1..4 tasks, running 2" in service.cli("show", el).stdout

    # 3. The other job ends; the elastic job grows back into the idle GPUs.
    (service.work / "release-other").touch()
    assert service.wait_state(other, "succeeded", "failed", timeout_s=30)["state"] == "succeeded"
    grown = wait_for("four tasks again", lambda: attempt_with(service, el, 3, 4), 45)
    assert "growing" in [e["kind"] for e in grown["events"]]
    assert sorted(s[2] for s in starts(service) if s[3] == "2") == ["4"] * 4

    (service.work / "release-train").touch()
    assert service.wait_state(el, "succeeded", "failed", timeout_s=30)["state"] == "succeeded"
    shown = service.cli("show", el).stdout
    assert "1..4 tasks" in shown


CAPPED = """elastic_grow_after: 3s
cycle_interval: 1s
queues:
  - {name: default}
  - {name: capped, limit: {gpus: 3}}
"""


def gpus_used(service: Service, queue: str) -> float:
    return float(
        next(q for q in service.cli_json("queues")["queues"] if q["name"] == queue)["used"]["gpus"]
    )


def test_an_elastic_job_starts_at_what_its_queue_has_room_for_and_grows_within_it(
    tmp_path: Path,
) -> None:
    # Queue capped may hold 3 GPUs of the 4. With one held by another job of the queue, the
    # elastic job (1..4 tasks of one GPU) starts with the 2 its queue has room for. While that
    # job runs, the idle GPU does not grow it (its queue would take it back no larger); once
    # it ends, the job grows to 3, the queue's limit, not to the 4 the node has.
    with local_service(tmp_path, CAPPED) as service:
        (service.work / "train.py").write_text(TRAIN)
        (service.work / "elastic.yaml").write_text(ELASTIC + "queue: capped\n")
        other = service.run(
            "--gpus", "1", "--cpus", "0.5", "--mem", "256M", "--queue", "capped", "--name",
            "other", "--", PY, "-c",
            "import os, time\nwhile not os.path.exists('release-other'): time.sleep(0.05)",
        )  # fmt: skip
        assert service.wait_state(other, "running")["state"] == "running"
        el = str(service.cli_json("submit", "elastic.yaml")["id"])
        # 1. Two tasks, world size 2, beside the other job; the queue counts the three GPUs run.
        first = wait_for("two tasks", lambda: attempt_with(service, el, 1, 2), 30)
        assert sorted(s[1:3] for s in starts(service)) == [["0", "2"], ["1", "2"]]
        assert "1..4 tasks, running 2" in service.cli("show", el).stdout
        assert gpus_used(service, "capped") == 3
        # 2. It runs past its grow delay (3 s) with a GPU idle and its queue full: not grown.
        wait_for("rank 0 to train 300 steps", (service.work / "stepped-300-0-0").exists, 30)
        j = service.job(el)
        assert (j["attempt"], j["running_tasks"]) == (1, 2)
        assert "growing" not in [e["kind"] for e in j["events"]]
        # 3. The other job ends: the job grows to its queue's limit, from its checkpoint.
        (service.work / "release-other").touch()
        assert service.wait_state(other, "succeeded", "failed")["state"] == "succeeded"
        grown = wait_for("three tasks", lambda: attempt_with(service, el, 2, 3), 45)
        assert [e["kind"] for e in grown["events"]].count("growing") == 1
        assert sorted(s[2] for s in starts(service) if s[3] == "1") == ["3"] * 3
        assert gpus_used(service, "capped") == 3
        assert (first["preemptions"], first["failures"]) == (0, 0)
        (service.work / "release-train").touch()
        assert service.wait_state(el, "succeeded", "failed")["state"] == "succeeded"
