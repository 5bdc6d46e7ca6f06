"""Services in the control loop: replica jobs made and cancelled on scale commands, a service
waiting in a pipeline, cancellation, and a restart. A real SQLite store, a fake executor and a
fake clock (see test_loop.py); the autoscaler is not involved (its rule is core.autoscale)."""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_pipelines import finish, step, submit_all
from world import World, new_world

from aisched.executors.base import ExitKind
from aisched.model.job import Dependency, DependencyCondition, Job, JobKind
from aisched.model.service import ServiceSpec
from aisched.model.states import JobState
from aisched.service.autoscaler import Autoscaler
from aisched.service.loop import Rejected
from aisched.service.replicas import HOST_ENV, PORT_ENV, replica_port
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node


def web(min_replicas: int = 1, max_replicas: int = 6, *deps: str) -> Job:
    return replace(
        job("web").task(gpu=1).priority(100).build(),
        name="web",
        kind=JobKind.SERVICE,
        service=ServiceSpec(min_replicas, max_replicas),
        depends_on=tuple(Dependency(d) for d in deps),
    )


def replicas(w: World, sid: str) -> list[tuple[str, str, str | None]]:
    """(id, state, stopping) of every replica ever made, oldest first."""
    with w.store.read() as tx:
        rows = tx.list_jobs(states=None, queue=None, user=None, limit=1000)
    out = [(r["id"], r["state"], r["stopping"]) for r in rows if r["spec"]["replica_of"] == sid]
    return sorted(out, key=lambda r: int(r[0]))


def scale(w: World, sid: str, n: int) -> int:
    fut = w.sched.scale(sid, n, "test")
    w.sched.step()
    return fut.result(0)


def test_a_service_runs_its_minimum_then_scales_up_and_cancels_pending_replicas_first(
    w: World,
) -> None:
    sid = w.submit(web(min_replicas=2))
    assert w.state(sid)["state"] == "running"
    assert w.fx.keys(sid) == []  # the service itself runs no task
    assert [r[1] for r in replicas(w, sid)] == ["running", "running"]
    launch = w.fx.launched[0]
    assert launch.env[PORT_ENV] and launch.env["AISCHED_SERVICE_ID"] == sid
    assert scale(w, sid, 5) == 5  # one more than the 4 GPUs hold: the newest waits
    assert [r[1] for r in replicas(w, sid)] == ["running"] * 4 + ["pending"]
    assert scale(w, sid, 3) == 3
    got = replicas(w, sid)
    assert [(r[1], r[2]) for r in got] == [
        ("running", None),
        ("running", None),
        ("running", None),
        ("running", "cancel"),  # the newest running one is being stopped
        ("cancelled", None),  # the pending one went first
    ]
    assert scale(w, sid, 99) == 6  # clamped to max_replicas


def test_a_service_in_a_pipeline_starts_once_its_dependency_succeeded(w: World) -> None:
    prep, sid = submit_all(w, step("prep"), web(1, 2, "prep"))
    assert (w.state(sid)["state"], w.state(sid)["reason_code"]) == ("pending", "wait-dependencies")
    assert replicas(w, sid) == []
    finish(w, prep)
    assert w.state(sid)["state"] == "running"
    assert [r[1] for r in replicas(w, sid)] == ["running"]


def test_cancelling_a_service_cancels_its_replicas(w: World) -> None:
    sid = w.submit(web(min_replicas=2))
    fut = w.sched.cancel(sid)
    w.sched.step()
    assert fut.result(0) == "running"  # until its replicas have stopped
    assert [r[2] for r in replicas(w, sid)] == ["cancel", "cancel"]
    for rid, _, _ in replicas(w, sid):
        finish(w, rid, code=-15)
    assert [r[1] for r in replicas(w, sid)] == ["cancelled", "cancelled"]
    scaled = w.sched.scale(sid, 1, "test")
    w.sched.step()
    with pytest.raises(Rejected, match=f"no live service {sid}"):
        scaled.result(0)


def test_a_cancelled_service_ends_and_frees_its_dependents_once_its_replicas_have_stopped(
    w: World,
) -> None:
    # It was cancelled at once, so a job waiting on it (`condition: any`) started while its
    # replicas were still stopping, and its reason said they were stopping for good.
    sid, after = submit_all(
        w, web(min_replicas=2), step("report", "web", condition=DependencyCondition.ANY)
    )
    keys = [k for rid, _, _ in replicas(w, sid) for k in w.fx.keys(rid)]
    w.fx.stubborn.update(keys)  # they take their grace period to stop
    fut = w.sched.cancel(sid)
    w.sched.step()
    assert fut.result(0) == "running"
    assert (w.state(sid)["state"], w.state(sid)["stopping"]) == ("running", "cancel")
    assert w.state(after)["state"] == "pending"
    scaled = w.sched.scale(sid, 2, "a round that began before the cancel")
    w.sched.step()
    with pytest.raises(Rejected, match=f"service {sid} is being cancelled"):
        scaled.result(0)
    w.restart()  # the stop goes on after a restart
    w.sched.step()
    assert w.state(after)["state"] == "pending"
    first, second = keys
    w.fx.exit(first, -15, ExitKind.STOPPED)
    w.sched.step()
    assert (w.state(sid)["state"], w.state(after)["state"]) == ("running", "pending")
    w.fx.exit(second, -15, ExitKind.STOPPED)
    w.sched.step()
    w.sched.step()
    ended = w.state(sid)
    assert (ended["state"], ended["stopping"], ended["message"]) == (
        "cancelled",
        None,
        "cancelled; its replicas have stopped",
    )
    assert [r[1] for r in replicas(w, sid)] == ["cancelled", "cancelled"]
    assert w.state(after)["state"] == "running"


def test_a_restarted_scheduler_keeps_the_service_and_its_replicas(w: World) -> None:
    sid = w.submit(web(min_replicas=1))
    (rid, _, _) = replicas(w, sid)[0]
    port = replica_port(w.sched.jobs[rid].job)
    w.restart()
    w.sched.step()
    assert w.state(sid)["state"] == "running"
    assert [r.id for r in w.sched.replicas_of(sid)] == [rid]
    assert replica_port(w.sched.jobs[rid].job) == port
    assert scale(w, sid, 2) == 2
    assert [r[1] for r in replicas(w, sid)] == ["running", "running"]


def test_a_service_early_in_a_pipeline_does_not_shift_the_ids_of_later_jobs(w: World) -> None:
    sid, train, prep = submit_all(w, web(min_replicas=2), step("train", "prep"), step("prep"))
    assert (int(train), int(prep)) == (int(sid) + 1, int(sid) + 2)  # replicas come after
    assert w.sched.jobs[train].job.depends_on == (Dependency(prep),)
    assert [int(r[0]) > int(prep) for r in replicas(w, sid)] == [True, True]
    assert w.state(train)["reason"] == f"waiting for job {prep} (prep) to succeed"


class FarExecutor(FakeExecutor):
    """Nodes that are other machines: each is reached at its own address (127.0.0.2 here, a
    loopback address that is not the scheduler's own 127.0.0.1)."""

    def node_address(self, node: str) -> str | None:
        return "127.0.0.2"


@pytest.fixture
def replica_server() -> Iterator[Callable[[str, int], None]]:
    """Start a replica's HTTP endpoints (readiness, Prometheus metrics) at host:port."""
    servers: list[ThreadingHTTPServer] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"ok" if self.path == "/healthz" else b"# TYPE rps gauge\nrps 12\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    def start(host: str, port: int) -> None:
        server = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_replicas_listen_on_their_nodes_address_where_the_autoscaler_finds_them(
    tmp_path: Path, replica_server: Callable[[str, int], None]
) -> None:
    w = new_world(tmp_path, FarExecutor([fake_node(gpus=4)]))
    fx, clock = w.fx, w.clock
    spec = ServiceSpec(1, 4, readiness_path="/healthz", metrics_path="/metrics")
    sid = w.submit(replace(web(), service=spec))
    (launch,) = fx.launched
    assert launch.env[HOST_ENV] == "127.0.0.2"
    port = int(launch.env[PORT_ENV])
    replica_server("127.0.0.2", port)  # what the replica would serve once up
    scaler = Autoscaler(w.sched, clock=clock)
    scaler.tick()
    status = scaler.status(sid)
    assert status is not None
    assert (status.endpoints, status.load) == ((f"127.0.0.2:{port}",), 12.0)
    assert status.desired == 2  # 12 rps on one replica for a target of 10
    w.sched.step()
    assert [r[1] for r in replicas(w, sid)] == ["running", "running"]


def test_one_users_replicas_that_never_answer_do_not_hold_another_users_scaling(
    w: World,
) -> None:
    # Alice's replica takes its whole timeout to answer every probe (here: until released, as
    # hundreds of such replicas would one after another); Bob's service is scaled meanwhile.
    alice = w.submit(replace(web(), user="alice"))
    bob = w.submit(replace(web(), user="bob"))
    (slow,) = [replica_port(r.job) for r in w.sched.replicas_of(alice)]
    released = threading.Event()

    def fetch(url: str, timeout_s: float, owners: frozenset[int] | None) -> tuple[int, bytes]:
        if f":{slow}/" in url:
            released.wait(30)
        return 200, b""

    scaler = Autoscaler(w.sched, fetch=fetch)
    ticking = threading.Thread(target=scaler.tick)
    ticking.start()
    try:
        for _ in range(100):  # Bob's status comes as soon as his own round is over
            if scaler.status(bob) is not None:
                break
            time.sleep(0.1)
        assert scaler.status(bob) is not None, "bob's service waited for alice's replica"
        assert scaler.status(alice) is None
    finally:
        released.set()
        ticking.join()
        scaler.close()
    assert scaler.status(alice) is not None


def test_a_closed_autoscaler_gives_up_its_round(w: World) -> None:
    # Rounds run on workers that the interpreter waits for at exit: closing must end them
    # after the probe under way, not after a user's hundreds of slow replicas.
    w.submit(web(min_replicas=3))
    asked: list[str] = []
    probing, released = threading.Event(), threading.Event()

    def fetch(url: str, timeout_s: float, owners: frozenset[int] | None) -> tuple[int, bytes]:
        asked.append(url)
        probing.set()
        released.wait(30)
        return 0, b""

    scaler = Autoscaler(w.sched, fetch=fetch)
    ticking = threading.Thread(target=scaler.tick)
    ticking.start()
    assert probing.wait(30)
    scaler.close()
    released.set()
    ticking.join()
    assert len(asked) == 1


def test_a_job_that_fits_only_once_a_replica_ends_holds_nothing_and_others_start(
    pw: World,
) -> None:
    """A replica serves until it is scaled down. Before, it was predicted as the batch jobs
    before it had run (seconds), so a job needing its GPU reserved the node from 'now' for
    ever, its start overdue, and every job behind it waited for a reservation that never
    began: the examples' pipeline stalled beside an idle node."""
    for i in range(3):  # finished jobs to learn from: seconds each
        done = pw.submit(job(f"quick{i}").task(cpu=1).build())
        pw.clock.t += 2
        finish(pw, done)
    sid = pw.submit(web(min_replicas=1))
    ((replica, state, _),) = replicas(pw, sid)
    assert state == "running"
    assert pw.state(replica)["predicted_s"] is None  # not a batch job's runtime
    whole = pw.submit(job("whole").task(gpu=4).build())
    pw.clock.t += 60  # past what a batch job's runtime would have been
    pw.sched.step()
    short = pw.submit(job("short").task(gpu=1).build())
    assert pw.state(short)["predicted_s"] is not None
    assert pw.state(short)["state"] == "running"
    row = pw.state(whole)
    assert (row["state"], row["reason_code"]) == ("pending", "wait-resources")
    assert row["reason"] == "room for 0 of 1 'g0' tasks (4 GPU, 1 CPU, 1 GiB memory each)"


def test_a_scale_down_goes_ahead_while_replicas_start_and_takes_those_first(w: World) -> None:
    # It waited until every replica was ready: pending replicas had to start before they
    # could go, and one that never got room held the service at its largest count.
    spec = ServiceSpec(1, 6, readiness_path="/healthz", scale_down_window_s=0.0)
    sid = w.submit(replace(web(), service=spec))
    assert scale(w, sid, 6) == 6  # 4 GPUs: four run, two wait
    running = [r.id for r in w.sched.replicas_of(sid) if r.state == JobState.RUNNING]
    answering = {replica_port(w.sched.jobs[i].job) for i in running[2:]}  # the newest two

    def fetch(url: str, timeout_s: float, owners: frozenset[int] | None) -> tuple[int, bytes]:
        ready = urllib.parse.urlsplit(url).port in answering
        return (200, b"") if ready else (0, b"")

    scaler = Autoscaler(w.sched, clock=w.clock, fetch=fetch)
    try:
        scaler.push(sid, {"rps": 15})  # two replicas' worth
        scaler.tick()
    finally:
        scaler.close()
    w.sched.step()
    kept = [r[0] for r in replicas(w, sid) if r[1] == "running" and r[2] is None]
    assert kept == running[2:]  # the pending ones went, then those not ready
    assert [r.id for r in w.sched.replicas_of(sid)] == running[2:]
