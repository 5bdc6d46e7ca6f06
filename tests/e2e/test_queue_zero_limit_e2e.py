"""A queue limited to 0 GPUs on a real `aisched up`: its GPU jobs are refused at submission with
the reason, its CPU jobs run, and every view of the queue shows the limit as 0, not as no limit.
A 0 in a limit used to mean "not capped", so such a queue could take every GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, local_service, wait_for
from prometheus_client.parser import text_string_to_metric_families

CONFIG = """
queues:
  - name: default
  - name: cpu-only
    limit: {gpus: 0}
"""


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with local_service(tmp_path, config=CONFIG) as svc:
        yield svc


def test_a_queue_limited_to_0_gpus_runs_cpu_jobs_and_refuses_gpu_jobs(service: Service) -> None:
    refused = service.cli("run", "--queue", "cpu-only", "--gpus", "1", "--", "true", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "needs more GPU than queue cpu-only's limit (0: it may use no GPU)" in refused.stderr

    # CPUs and memory are not capped by it: a CPU job there runs.
    cpu_job = service.run("--queue", "cpu-only", "--cpus", "2", "--", "sleep", "300")
    service.wait_state(cpu_job, "running")

    (queue,) = [q for q in service.cli_json("queues")["queues"] if q["name"] == "cpu-only"]
    assert queue["limit"] == {"gpus": 0}
    row = next(line for line in service.cli("queues").stdout.splitlines() if "cpu-only" in line)
    assert "0 GPU" in row, row
    dashboard = service.api.get("/v1/dashboard").json()
    (shown,) = [q for q in dashboard["queues"] if q["name"] == "cpu-only"]
    assert shown["limit_gpus"] == 0
    limits = {
        s.labels["queue"]: s.value
        for f in text_string_to_metric_families(service.api.get("/metrics").text)
        for s in f.samples
        if f.name == "aisched_queue_limit_gpus"
    }
    assert limits == {"cpu-only": 0}


def test_guarantees_beyond_the_cluster_start_with_a_warning(tmp_path: Path) -> None:
    config = "queues:\n  - {name: a, guarantee: {gpus: 3}}\n  - {name: b, guarantee: {gpus: 2}}\n"
    with local_service(tmp_path, config=config) as svc:
        said = (
            "WARNING aisched.service: queues: the top-level queues' guarantees add up to 5 GPU, "
            "more than the cluster's 4 now: reclaim cannot give every queue its guarantee at once"
        )
        wait_for("the warning in the service's log", lambda: said in svc.log.read_text())
        assert svc.cli_json("queues")["queues"][0]["guarantee"]["gpus"] == 3  # it runs
