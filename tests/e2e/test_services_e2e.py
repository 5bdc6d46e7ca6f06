"""End to end: a `service` job on the real service, its replicas real HTTP servers on loopback.

The load is real too, and bounded: one client thread sends requests round-robin to the ready
replicas the API lists, about 25 a second, for as long as the test needs (at most 90 s). The
replicas count what they serve and the autoscaler scrapes them; nothing is pushed by the test.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from harness import Service, wait_for

PY = sys.executable
REPLICA = Path(__file__).resolve().parents[2] / "examples" / "services" / "http_replica.py"


def service_file(gpus: int = 0) -> str:
    return textwrap.dedent(
        f"""
        name: web
        kind: service
        priority: 100
        command: [{PY}, http_replica.py]
        resources: {{cpus: 0.5, mem: 128M, gpus: {gpus}}}
        grace_period: 5s
        service:
          min_replicas: 1
          max_replicas: 3
          target: 5
          metrics_path: /metrics
          scale_down_window: 3s
        """
    )


def submit_service(service: Service, gpus: int = 0) -> str:
    shutil.copy(REPLICA, service.work / "http_replica.py")
    (service.work / "web.yaml").write_text(service_file(gpus))
    return str(service.cli_json("submit", "web.yaml")["id"])


def status(service: Service, sid: str) -> dict[str, Any]:
    st: dict[str, Any] = service.job(sid)["service"]
    return st


def replicas_ready(service: Service, sid: str, n: int) -> dict[str, Any] | None:
    st = status(service, sid)
    return st if st["replicas"] == n and st["ready"] == n else None


@contextmanager
def load(service: Service, sid: str, rps: float = 25.0, limit_s: float = 90.0) -> Iterator[None]:
    """Send about `rps` requests a second, spread over the ready replicas, until the block
    ends (or `limit_s` passes: the load is bounded whatever happens)."""
    stop = threading.Event()

    def send() -> None:
        deadline = time.monotonic() + limit_s
        endpoints: list[str] = []
        refreshed = 0.0
        i = 0
        with httpx.Client(timeout=2.0, headers=service.api.headers) as client:
            while not stop.is_set() and time.monotonic() < deadline:
                if time.monotonic() - refreshed > 0.5:
                    got = client.get(f"{service.url}/v1/jobs/{sid}").json()["service"]
                    endpoints, refreshed = got["endpoints"], time.monotonic()
                if endpoints:
                    with contextlib.suppress(httpx.HTTPError):  # a replica going away
                        client.get(f"http://{endpoints[i % len(endpoints)]}/work")
                    i += 1
                time.sleep(1.0 / rps)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(10)


def scaling_events(service: Service, sid: str) -> list[str]:
    return [
        e["message"].split(":")[0] for e in service.job(sid)["events"] if e["kind"] == "scaling"
    ]


def test_a_service_scales_up_under_load_and_back_down_after(service: Service) -> None:
    sid = submit_service(service)
    wait_for("one ready replica", lambda: replicas_ready(service, sid, 1), 60)
    with load(service, sid):
        st = wait_for("three ready replicas", lambda: replicas_ready(service, sid, 3), 60)
        assert st["max_replicas"] == 3 and len(st["endpoints"]) == 3
    wait_for("one replica again", lambda: replicas_ready(service, sid, 1), 60)
    events = scaling_events(service, sid)
    assert events[0] == "0 -> 1 replicas"
    assert any(e.endswith("-> 3 replicas") for e in events), events
    assert events[-1].endswith("-> 1 replicas"), events
    # Scaled-down replicas were cancelled; the service itself still runs until cancelled.
    assert service.job(sid)["state"] == "running"
    shown = service.cli("show", sid).stdout
    assert re.search(r"replicas +1 \(1 ready; 1\.\.3\)", shown), shown
    assert "attempts" not in shown, shown  # its replicas have attempts; the service has none
    service.cli("cancel", sid)
    # The service ends once its replicas have stopped (its dependents wait for that).
    wait_for("no replica left", lambda: not service.cli_json("jobs")["jobs"], 30)
    assert service.job(sid)["state"] == "cancelled"


CHECKPOINTING_BATCH = textwrap.dedent(
    """
    import os, signal, sys, time
    ckpt = os.path.join(os.environ["AISCHED_CHECKPOINT_DIR"], "step")
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    with open("batch.log", "a") as f:
        f.write(f"start restart={os.environ['AISCHED_RESTART_COUNT']} from={step}\\n")
    def term(*_):
        with open(ckpt, "w") as f:
            f.write(str(step))
        with open("batch.log", "a") as f:
            f.write(f"checkpointed at={step}\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    while not os.path.exists("release"):
        step += 1
        time.sleep(0.05)
    """
)


def test_batch_on_idle_service_capacity_is_preempted_by_a_scale_up_and_resumes(
    service: Service,
) -> None:
    sid = submit_service(service, gpus=1)  # each replica holds one of the 4 GPUs
    wait_for("one ready replica", lambda: replicas_ready(service, sid, 1), 60)
    (service.work / "batch.py").write_text(CHECKPOINTING_BATCH)
    batch = service.run("--gpus", "3", "--name", "fill", "--", PY, "batch.py")
    service.wait_state(batch, "running")  # the capacity the service may need is idle: used
    with load(service, sid):
        wait_for("three ready replicas", lambda: replicas_ready(service, sid, 3), 60)
        j = service.job(batch)
        assert (j["state"], j["preemptions"]) == ("pending", 1)
    log = (service.work / "batch.log").read_text().splitlines()
    assert log[0] == "start restart=0 from=0"
    assert log[1].startswith("checkpointed at=")
    # Load gone: the service shrinks back and the batch job resumes from its checkpoint.
    wait_for("one replica again", lambda: replicas_ready(service, sid, 1), 60)
    service.wait_state(batch, "running", timeout_s=30)
    saved = log[1].removeprefix("checkpointed at=")
    wait_for(
        "the batch job to restart",
        lambda: len((service.work / "batch.log").read_text().splitlines()) >= 3,
    )
    assert (service.work / "batch.log").read_text().splitlines()[2] == (
        f"start restart=1 from={saved}"
    )
    (service.work / "release").touch()
    assert service.wait_state(batch, "succeeded", "failed")["state"] == "succeeded"


def test_a_pipeline_ending_in_a_service_starts_it_once_the_model_is_trained(
    service: Service,
) -> None:
    shutil.copy(REPLICA, service.work / "http_replica.py")
    (service.work / "hold.py").write_text(
        "import os, time\nwhile not os.path.exists('release'): time.sleep(0.05)\n"
        "open('model.bin', 'w').close()\n"
    )
    serve = service_file().replace("name: web\n", "name: web\ndepends_on: [train]\n")
    (service.work / "p.yaml").write_text(
        f"name: train\ncommand: [{PY}, hold.py]\n---\n" + textwrap.dedent(serve)
    )
    train, _, sid, _ = service.cli("submit", "p.yaml").stdout.split()
    service.wait_state(train, "running")
    waiting = service.job(sid)
    assert (waiting["state"], waiting["reason"]) == (
        "pending",
        f"waiting for job {train} (train) to succeed",
    )
    assert waiting["service"]["replica_ids"] == []
    (service.work / "release").touch()
    service.wait_state(train, "succeeded")
    service.wait_state(sid, "running")
    wait_for("one ready replica", lambda: replicas_ready(service, sid, 1), 60)
    assert (service.work / "model.bin").exists()
