"""High availability for real: a real PostgreSQL server, two `aisched up` processes sharing it
and one data directory (the supervisors' task directories), 50 jobs running and 200 waiting.
The leader is killed with SIGKILL; the standby takes over within the bound, adopts the running
tasks and runs the rest. Every job ends exactly once (its side-effect file has one line, its
events one end) and none is lost. The old leader, started again, stands by, and a write
carrying its old term is refused by the database.

The takeover time (kill to the standby leading) is printed; benchmarks/bench_ha.py measures
it over several kills for docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Service, free_port, stopped, wait_for
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from aisched.store.db import Deposed, Store, normalize_url
from aisched.store.lease import Fence, read_lease, try_acquire
from aisched.testing.postgres import PostgresServer

RUNNING, WAITING = 50, 200
TAKEOVER_BOUND_S = 15.0
CONFIG = """\
cycle_interval: 1s
lease_ttl: 6s
lease_renew: 2s
lease_poll: 0.5s
"""


def instance(home: Path, work: Path, name: str, url: str) -> Service:
    config = home / "ha.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    args = ["--database", url, "--config", str(config), "--cpus", str(RUNNING), "--mem", "8G"]
    svc = Service(home, free_port(), work, [*args, "--gpus", "0"])
    svc.log = home / f"{name}.log"
    return svc


@pytest.fixture
def pair(tmp_path: Path, pg_server: PostgresServer) -> Iterator[tuple[Service, Service, str]]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    url = pg_server.create_database()
    a, b = instance(home, work, "a", url), instance(home, work, "b", url)
    yield a, b, url
    for svc in (a, b):
        if svc.proc is not None and svc.proc.poll() is None:
            try:
                for j in svc.api.get("/v1/jobs").json()["jobs"]:
                    svc.api.post(f"/v1/jobs/{j['id']}/cancel")
            except (httpx.HTTPError, AssertionError):  # a standby's token, a failed test's
                pass
    for svc in (a, b):
        svc.stop()  # whatever happened above: a service left running outlives the test


def cli(tmp_path: Path, servers: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AISCHED_SERVER": servers, "AISCHED_TOKEN": token}
    env["AISCHED_HOME"] = str(tmp_path / "client")
    return subprocess.run(
        [sys.executable, "-m", "aisched", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def health(svc: Service) -> dict[str, object]:
    return dict(httpx.get(f"{svc.url}/v1/healthz", timeout=2).json())


INTERRUPTED = "its launch was interrupted by a scheduler restart"


def starts_and_ends(events: list[dict[str, str]]) -> tuple[int, int]:
    """How many attempts of a job started and how many times it succeeded. An attempt is
    `placed` once its launch is committed and `started` once its tasks are made (or, when the
    leader died before recording that, once the standby finds them running); one whose launch
    the leader's death cut short never ran and has no `started`."""
    kinds = [e["kind"] for e in events]
    return kinds.count("started"), kinds.count("succeeded")


def test_kill_9_of_the_leader_the_standby_takes_over_and_every_job_ends_once(
    pair: tuple[Service, Service, str], tmp_path: Path
) -> None:
    a, b, url = pair
    out = tmp_path / "out"
    out.mkdir()
    a.start()
    b.start()
    assert health(a) == a.alive_leader()
    assert health(b) == {"ok": True, "role": "standby", "term": 1, "leader": a.url}
    b.token = a.admin_token()  # one database: a token made on one instance works on both
    script = f"sleep 4; echo once >> {out}/$AISCHED_JOB_ID"
    ids = []
    for _ in range(RUNNING + WAITING):
        doc = {"command": ["sh", "-c", script], "resources": {"cpus": 1, "mem": "64M"}}
        r = a.api.post("/v1/jobs", json=doc)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    refused = b.api.post("/v1/jobs", json={"command": ["true"]})
    assert (refused.status_code, refused.json()["leader"]) == (421, a.url)

    def running() -> int:
        return len(a.api.get("/v1/jobs", params={"state": "running"}).json()["jobs"])

    wait_for(f"{RUNNING} jobs to run", lambda: running() == RUNNING, 60)
    with Store(url) as store, store.lease_tx() as conn:
        old = read_lease(conn)
    assert (old.term, old.address) == (1, a.url)

    killed = time.monotonic()
    a.kill9()
    wait_for("the standby to lead", lambda: health(b)["role"] == "leader", 30)
    takeover_s = time.monotonic() - killed
    print(f"\ntakeover after kill -9 of the leader: {takeover_s:.2f} s")
    assert takeover_s < TAKEOVER_BOUND_S
    assert health(b) == b.alive_leader(term=2)

    def all_ended() -> bool:
        jobs = b.api.get("/v1/jobs", params={"all": "true", "limit": 1000}).json()["jobs"]
        return len(jobs) == len(ids) and all(j["state"] == "succeeded" for j in jobs)

    wait_for("every job to succeed", all_ended, 180)
    lines = {i: (out / i).read_text().splitlines() for i in ids if (out / i).exists()}
    assert lines == {i: ["once"] for i in ids}  # every job ran to its end once, none lost
    ends = {i: starts_and_ends(b.api.get(f"/v1/jobs/{i}").json()["events"]) for i in ids}
    assert ends == {i: (1, 1) for i in ids}  # one start and one end each: nothing ran twice

    a.start()  # the old leader comes back: it stands by
    assert health(a) == {"ok": True, "role": "standby", "term": 2, "leader": b.url}
    again = a.api.post("/v1/jobs", json={"command": ["true"]})
    assert (again.status_code, again.json()["leader"]) == (421, b.url)
    # The CLI given the standby alone follows it to the leader; a dead server is skipped.
    for servers in (a.url, f"http://127.0.0.1:{free_port()},{b.url}"):
        done = cli(tmp_path, servers, b.admin_token(), "run", "--json", "--", "true")
        assert done.returncode == 0, done.stderr
        new_id = json.loads(done.stdout)["id"]
        assert b.api.get(f"/v1/jobs/{new_id}").status_code == 200
    with Store(url) as store:  # a write carrying the dead leader's term never lands
        store.fence = Fence(old.holder, old.term)
        with pytest.raises(Deposed), store.tx() as tx:
            tx.update_job(ids[0], {"state": "failed"})
        store.fence = None
        with store.read() as tx:
            row = tx.get_job(ids[0])
    assert row is not None and row["state"] == "succeeded"


def test_a_standby_that_waited_on_the_lease_row_keeps_the_lease_it_takes(
    pair: tuple[Service, Service, str],
) -> None:
    """Another transaction holds the lease row (a leader stopped inside a write, a paused
    server) while the leader is dead: the standby's poll waits on the row's lock, past the
    lease's deadline. Once it has the lock it takes a fresh lease, and must keep it: it used
    to count its lease from before the wait, find it spent and stand down at once, leaving no
    instance leading."""
    a, b, url = pair
    # A poll waits on the lock for up to 20 s (not 5), past a lease's deadline (6 s less 2).
    (a.home / "ha.yaml").write_text(CONFIG + "limits: {store_busy_timeout: 20s}\n")
    a.start()
    b.start()
    a.kill9()
    engine = create_engine(normalize_url(url), poolclass=NullPool)
    try:
        with engine.connect() as holder, Store(url) as store:
            holder.execute(text("SELECT term FROM leader WHERE id = 1 FOR SHARE"))

            def expired() -> bool:
                with store.lease_tx() as conn:
                    return not read_lease(conn).live

            def waited_s() -> float:
                return float(
                    holder.execute(
                        text(
                            "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - "
                            "query_start)), 0) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND query LIKE '%FOR UPDATE%'"
                        )
                    ).scalar_one()
                )

            wait_for("the dead leader's lease to expire", expired, 30)
            wait_for("the standby's poll to wait past the deadline", lambda: waited_s() > 5, 30)
            holder.rollback()
    finally:
        engine.dispose()
    wait_for("the standby to lead", lambda: health(b)["role"] == "leader", 30)
    with Store(url) as store, store.lease_tx() as conn:
        taken = read_lease(conn)

    def renewed() -> bool:
        assert b.proc is not None and b.proc.poll() is None, b.log.read_text()[-2000:]
        with Store(url) as store, store.lease_tx() as conn:
            return read_lease(conn).expires_at > taken.expires_at

    wait_for("the new leader to renew its lease", renewed, 30)
    assert health(b) == b.alive_leader(term=2)


def test_the_cli_waits_out_a_takeover_and_tells_a_local_user_where_changes_go(
    pair: tuple[Service, Service, str], tmp_path: Path
) -> None:
    """Given every instance, a command sent just after the leader died went to the standby,
    was told of the dead leader and failed at once; it now waits for the standby to take
    over. A change on a standby's socket, without a token for the leader's TCP address, was
    answered 401 there, as if the socket were not local."""
    a, b, _ = pair
    a.start()
    b.start()
    token = a.admin_token()
    refused = subprocess.run(
        [sys.executable, "-m", "aisched", "--server", f"unix:{b.socket}", "run", "--", "true"],
        env={**os.environ, "AISCHED_HOME": str(tmp_path / "no-token")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (refused.returncode, refused.stderr) == (
        2,
        f"error: unix:{b.socket} is a standby: changes go to the leader at {a.url}, which "
        "needs a token over TCP (AISCHED_TOKEN or a token file: docs/security.md), or give "
        "--server the leader's own socket\n",
    )
    a.kill9()
    done = cli(tmp_path, f"{a.url},{b.url}", token, "run", "--json", "--", "true")
    assert done.returncode == 0, done.stderr
    assert "waiting for a standby to take over" in done.stderr
    job = b.api.get(f"/v1/jobs/{json.loads(done.stdout)['id']}").json()
    assert health(b)["role"] == "leader" and job["state"] in ("pending", "running", "succeeded")
    assert len(b.api.get("/v1/jobs", params={"all": "true"}).json()["jobs"]) == 1


def test_a_followed_job_is_followed_on_through_the_standby_when_the_leader_dies(
    pair: tuple[Service, Service, str], tmp_path: Path
) -> None:
    """`aisched run -f` given every instance ended with `lost the aisched service` when the
    leader died, though the job ran on; it now goes on with the standby, printing each line
    once."""
    a, b, _ = pair
    a.start()
    b.start()
    release = tmp_path / "release"
    script = f"echo one; echo two; while [ ! -e {release} ]; do sleep 0.1; done; echo three"
    env = {**os.environ, "AISCHED_SERVER": f"{a.url},{b.url}", "AISCHED_TOKEN": a.admin_token()}
    env["AISCHED_HOME"] = str(tmp_path / "client")
    follower = subprocess.Popen(
        [sys.executable, "-m", "aisched", "run", "-f", "--", "sh", "-c", script],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follower.stdout is not None
    lines = [follower.stdout.readline(), follower.stdout.readline()]
    assert lines == ["one\n", "two\n"]
    a.kill9()
    wait_for("the standby to lead", lambda: health(b)["role"] == "leader", 30)
    release.touch()
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert out == "three\n", err
    assert "going on with another instance" in err


def test_a_leader_whose_lease_is_taken_exits_with_a_line(
    pair: tuple[Service, Service, str],
) -> None:
    a, _, url = pair
    a.start()
    with Store(url) as store, store.lease_tx() as conn:  # another instance took over
        try_acquire(conn, "other", "http://other.test:1", 60.0, force=True)
    assert a.proc is not None
    assert a.wait_exit(30) == 3
    assert a.log.read_text().splitlines()[-1] == (
        "aisched: deposed: term 2 belongs to http://other.test:1 (this instance led term 1); "
        "stopped (tasks go on under the new leader); start it again to stand by"
    )


def test_a_leader_paused_between_committing_a_launch_and_making_it_never_runs_it(
    pair: tuple[Service, Service, str], tmp_path: Path
) -> None:
    # The leader stops itself (a real SIGSTOP, failpoint `pause-before-launch`) right after
    # committing a job's launch; its lease runs out and the standby takes over, recovers the
    # launch as interrupted and runs the job. When the old leader goes on, its launch must not
    # start: the job runs once.
    a, b, _ = pair
    a.extra_env = {"AISCHED_FAILPOINTS": "pause-before-launch"}
    out = tmp_path / "out"
    out.mkdir()
    a.start()
    b.start()
    b.token = a.admin_token()
    doc = {"command": ["sh", "-c", f"echo once >> {out}/$AISCHED_JOB_ID"]}
    r = a.api.post("/v1/jobs", json=doc)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert a.proc is not None
    wait_for("the leader to pause at its launch", lambda: stopped(a.proc.pid), 30)
    wait_for("the standby to lead", lambda: health(b)["role"] == "leader", 30)

    def state() -> str:
        return str(b.api.get(f"/v1/jobs/{job_id}").json()["state"])

    wait_for("the job to succeed under the new leader", lambda: state() == "succeeded", 60)
    a.proc.send_signal(signal.SIGCONT)
    assert a.wait_exit(30) == 3  # it finds itself deposed at its next write and exits
    time.sleep(1)  # what the old leader might still have started has had time to write
    assert (out / job_id).read_text().splitlines() == ["once"]
    events = b.api.get(f"/v1/jobs/{job_id}").json()["events"]
    cut = next(i for i, e in enumerate(events) if INTERRUPTED in e["message"])
    # Two attempts placed, one started and run: what a kill -9 of a leader at that instant
    # leaves too. The first, committed and never made, shows no `started`.
    kinds = [e["kind"] for e in events]
    assert "started" not in kinds[:cut] and kinds.count("placed") == 2
    assert starts_and_ends(events) == (1, 1)


class FreezableRelay:
    """A Unix-socket relay to the PostgreSQL server that can stop passing bytes on, the way a
    dead network path does (connections stay open, and what is sent gets no answer), or be
    cut, the way a server that went away is (connections closed, new ones refused)."""

    def __init__(self, server: PostgresServer, where: Path) -> None:
        where.mkdir()
        self.dir = where
        self.target = str(next(server.socket_dir.glob(".s.PGSQL.*")))
        self.frozen = threading.Event()
        self.open: list[socket.socket] = []
        self.is_cut = False
        self._cutting = threading.Lock()  # a connection is relayed whole or refused whole
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(where / Path(self.target).name))
        self.listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        return database_url.split("?host=")[0] + f"?host={self.dir}"

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            with self._cutting:
                if self.is_cut:  # accepted as it was cut: the server has gone away
                    near.close()
                    return
                far = socket.socket(socket.AF_UNIX)
                far.connect(self.target)
                self.open += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while self.frozen.is_set():
                    time.sleep(0.05)
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        with self._cutting:
            self.is_cut = True
            self._stop_listening()
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.frozen.clear()
        self._stop_listening()

    def _stop_listening(self) -> None:
        # Shut down before closing: a close alone leaves the socket listening while the
        # accepting thread waits in accept() on it (the kernel keeps it open for that call), and
        # the first connection after a cut reached the server.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def test_a_cut_relay_lets_no_connection_through(tmp_path: Path, pg_server: PostgresServer) -> None:
    """The relay's cut is the next test's database that went away. It closed its listener
    only, which a thread waiting in accept() on it kept listening: the first connection after
    the cut reached the server, the leader renewed its lease on it (failing only when another
    thread held that connection) and never deposed itself, on a loaded machine where that
    renewal came before the deadline's check."""
    url = pg_server.create_database()
    relay = FreezableRelay(pg_server, tmp_path / "relay")
    engine = create_engine(normalize_url(relay.url(url)), poolclass=NullPool)
    try:
        with engine.connect() as before:
            assert before.execute(text("SELECT 1")).scalar() == 1
            relay.cut()
            with pytest.raises(OperationalError):
                before.execute(text("SELECT 1"))
        with pytest.raises(OperationalError, match="Connection refused"):
            engine.connect()
    finally:
        engine.dispose()
        relay.close()


def test_a_leader_whose_database_stops_answering_steps_down(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    """No error comes back from a connection that hangs, so the renewal that waits on it never
    reaches its own deadline check: the leader still called itself the leader (ready, taking
    changes it could not store) while the standby led. It deposes itself by the deadline."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    url = pg_server.create_database()
    relay = FreezableRelay(pg_server, tmp_path / "relay")
    a = instance(home, work, "a", relay.url(url))
    try:
        a.start()
        assert health(a)["role"] == "leader"
        relay.frozen.set()
        assert a.proc is not None
        assert a.wait_exit(30) == 3  # lease_ttl 6 s less lease_renew 2 s, and some margin
        assert "no renewal of the lease came back for" in a.log.read_text()
    finally:
        relay.close()
        a.stop()


def test_a_leader_whose_database_went_away_says_why_in_one_line(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    """Renewals that fail depose the leader by the deadline. Its last line said it could not
    renew "for 4 s" (the deadline, however long it had been) and went on over several lines
    of SQLAlchemy's statement dump; or, when the watch deposed it first, not why at all."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    url = pg_server.create_database()
    relay = FreezableRelay(pg_server, tmp_path / "relay")
    a = instance(home, work, "a", relay.url(url))
    try:
        a.start()
        assert health(a)["role"] == "leader"
        relay.cut()
        assert a.proc is not None
        assert a.wait_exit(30) == 3
        last = a.log.read_text().splitlines()[-1]
        assert re.fullmatch(
            r"aisched: no renewal of the lease came back for \d+ s \(\(psycopg\.OperationalError\)"
            r" [^()]+\): a standby may lead now; stopped \(tasks go on, for the next leader to "
            r"adopt: a standby, if one can take over\); start it again to stand by",
            last,
        ), last
    finally:
        relay.close()
        a.stop()


def test_a_standby_whose_database_went_away_says_so_in_its_readiness(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    # An idle instance's readiness named only what it had tried to write: a standby (or a
    # leader with nothing to do) whose database went away still said only "not the leader".
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    url = pg_server.create_database()
    relay = FreezableRelay(pg_server, tmp_path / "relay")
    a, b = instance(home, work, "a", url), instance(home, work, "b", relay.url(url))
    try:
        a.start()
        b.start()
        assert health(b)["role"] == "standby"

        def problems() -> list[str]:
            return list(httpx.get(f"{b.url}/v1/readyz", timeout=2).json()["problems"])

        assert len(problems()) == 1  # not the leader, and nothing else
        relay.cut()
        wait_for("the standby's readiness to name the database", lambda: len(problems()) == 2)
        assert problems()[1].startswith("the lease could not be read: (psycopg.OperationalError)")
        assert health(b)["role"] == "standby"  # it goes on standing by, polling
        # Each failed poll is one line of its log, not the driver's page (3 to 7 lines each).
        polls = [ln for ln in b.log.read_text().splitlines() if "lease: " in ln]
        assert polls and all("(psycopg.OperationalError)" in ln for ln in polls)
        assert "Background on this error" not in b.log.read_text()
    finally:
        relay.close()
        for svc in (a, b):
            svc.stop()


def test_the_cli_moves_on_from_a_paused_leader_that_a_standby_named(
    pair: tuple[Service, Service, str], tmp_path: Path
) -> None:
    """Sent to a standby, a cancel was sent on to the leader it named, which was paused
    (SIGSTOP): its read time-out ended the command with "is `aisched up` running?" though the
    standby had taken over meanwhile. It now waits for the takeover and is done there."""
    a, b, _ = pair
    a.start()
    b.start()
    token = a.admin_token()
    job = a.api.post("/v1/jobs", json={"command": ["sleep", "600"]}).json()
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        done = cli(tmp_path, f"{b.url},{a.url}", token, "cancel", job["id"])
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    assert f"the leader {a.url} does not answer (ReadTimeout)" in done.stderr
    assert "waiting for a standby to take over" in done.stderr
    assert b.api.get(f"/v1/jobs/{job['id']}").json()["state"] == "cancelled"
    assert a.wait_exit(30) == 3  # resumed, it finds its term taken
    # Or its watch, waking late, deposes it first: not for a database that did not answer.
    assert "the database does not answer" not in a.log.read_text()
