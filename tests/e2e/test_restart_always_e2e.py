"""A job that restarts for ever, on a real `aisched up`: what it keeps stays bounded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from harness import local_service, wait_for

KEEP = 3
# The service's `max_backoff` caps the doubling wait of quick exits, so that the test sees many
# attempts in a few seconds; `keep_attempts` is what is under test.
CONFIG = f"cycle_interval: 0.2s\nmax_backoff: 0.2s\nlimits: {{keep_attempts: {KEEP}}}\n"


def counts(home: Path, job_id: str) -> tuple[set[int], int, set[str], set[str]]:
    """The job's attempts with task rows, its events, and its attempts' folders."""
    with sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT attempt FROM tasks WHERE job_id = ?", (job_id,)).fetchall()
        (events,) = db.execute("SELECT count(*) FROM events WHERE job_id = ?", (job_id,)).fetchone()
    folders = [{p.name for p in (home / kind / job_id).iterdir()} for kind in ("logs", "tasks")]
    return {a for (a,) in rows}, events, folders[0], folders[1]


def test_a_job_that_restarts_at_once_for_ever_keeps_its_latest_attempts_only(
    tmp_path: Path,
) -> None:
    """`sh -c "echo tick"` under `restart: always` with `backoff: 0s` was at attempt 1,478
    after a minute, with 1,479 task rows, 5,915 events and 35 MB in `tasks/JOB`, for ever.
    Now only its latest `limits.keep_attempts` attempts are kept, rows, folders and events."""
    with local_service(tmp_path, CONFIG) as svc:
        doc = {
            "command": ["sh", "-c", "echo tick"],
            "restart": {"policy": "always", "backoff": "0s"},
        }
        r = svc.api.post("/v1/jobs", json=doc)
        assert r.status_code == 201, r.text
        job_id = str(r.json()["id"])

        def attempt() -> int:
            return int(svc.api.get(f"/v1/jobs/{job_id}").json()["attempt"])

        wait_for("many attempts", lambda: attempt() >= 4 * KEEP, timeout_s=120)
        svc.cli("cancel", job_id)
        job = svc.wait_state(job_id, "cancelled")
        last = job["attempt"]
        attempts, events, logs, tasks = counts(svc.home, job_id)
        # The latest KEEP attempts, the last one's forgetting at most a step behind.
        assert attempts <= set(range(last - KEEP, last + 1)) and last in attempts
        assert {int(a) for a in logs} <= set(range(last - KEEP, last + 1))
        assert {int(a) for a in tasks} <= set(range(last - KEEP, last + 1))
        # Its first 5, a handful per kept attempt (placed, started, its task's exit,
        # restarting), the note, and its cancellation.
        assert events <= 5 + 4 * (KEEP + 1) + 1 + 3
        before = svc.home / "logs" / job_id / str(last - 1) / "main-0.log"  # kept, whole
        assert before.read_text() == "tick\n"
        kinds = [e["kind"] for e in job["events"]]
        assert kinds[0] == "submitted" and kinds.count("attempts-forgotten") == 1
        shown = " ".join(svc.cli("show", job_id).stdout.split())  # as wrapped
        assert f"a live job keeps its latest {KEEP} (limits.keep_attempts)" in shown
        # The logs of a forgotten attempt, or of one it never had: said so, not an empty log.
        first = min(attempts)
        gone = svc.cli("logs", job_id, "--attempt", "1", check=False)
        assert (gone.returncode, gone.stdout) == (2, "")
        assert " ".join(gone.stderr.split()) == (
            f"error: job {job_id}'s attempt 1 is no longer kept, nor its logs (a live job keeps "
            f"its latest attempts only, limits.keep_attempts): attempts {first} to {last} are"
        )
        never = svc.cli("logs", job_id, "--attempt", str(last + 1), check=False)
        assert (never.returncode, never.stdout) == (2, "")
        assert never.stderr == f"error: job {job_id} has had {last} attempt(s), not {last + 1}\n"
        kept = svc.cli("logs", job_id, "--attempt", str(last - 1))
        assert kept.stdout == "tick\n"
