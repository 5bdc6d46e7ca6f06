"""Each schema version's tables, as a new database has them: a change to `store.schema` made
without a new `SCHEMA_VERSION` (and its step in `store.migrate.MIGRATIONS`) fails here. That is
how version 5 gained `tokens.read_only` after its first release, and the databases of those
first releases failed every token request until version 6 added it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, inspect

from aisched.store.db import Store
from aisched.store.schema import SCHEMA_VERSION

Tables = dict[str, tuple[list[str], list[tuple[str, tuple[str, ...], bool]]]]

JOBS = [
    "attained_gpu_s", "attempt", "attempt_started_at", "checkpoint_dir", "eta", "exit_code",
    "failures", "finished_at", "format", "id", "idempotency_key", "kind", "message", "name",
    "not_before", "predicted_s", "predicted_upper_s", "preemptions", "priority", "queue",
    "reason", "reason_code", "seq", "spec", "started_at", "state", "stopping", "submitted_at",
    "user", "waiting_for", "warnings",
]  # fmt: skip
TASKS = [
    "attempt", "exit_code", "exit_kind", "finished_at", "gpu_mem_mib", "gpu_milli", "gpus",
    "grp", "handle", "idx", "job_id", "log_path", "mem_mib", "message", "milli_cpu", "name",
    "node", "rank", "started_at", "state",
]  # fmt: skip
TOKENS = [
    "admin", "created_at", "created_by", "digest", "expires_at", "id", "note", "read_only",
    "revoked_at", "user",
]  # fmt: skip

# Columns (sorted) and indexes (name, columns, unique) of every table, by schema version.
SCHEMAS: dict[int, Tables] = {
    6: {
        "audit": (
            ["action", "actor", "detail", "owner", "seq", "target", "time", "via"],
            [],
        ),
        "events": (
            ["job_id", "kind", "message", "seq", "time"],
            [("ix_events_job", ("job_id", "seq"), False)],
        ),
        "jobs": (
            JOBS,
            [
                ("ix_jobs_finished", ("finished_at",), False),
                ("ix_jobs_idempotency", ("user", "idempotency_key"), True),
                ("ix_jobs_state", ("state",), False),
            ],
        ),
        "leader": (["address", "expires_at", "holder", "id", "term"], []),
        "meta": (["key", "value"], []),
        "tasks": (TASKS, []),
        "tokens": (TOKENS, []),
    },
}
# 7: a job's quick exits under `restart: always`.
SCHEMAS[7] = {**SCHEMAS[6], "jobs": (sorted([*JOBS, "quick_exits"]), SCHEMAS[6]["jobs"][1])}
# 8: the digest of each token's dashboard cookie (its MAC is keyed with the secret), and the
# uid its user had when it was made.
SCHEMAS[8] = {**SCHEMAS[7], "tokens": (sorted([*TOKENS, "cookie_digest", "uid"]), [])}


def tables_of(path: Path) -> Tables:
    insp = inspect(create_engine(f"sqlite:///{path}"))
    return {
        t: (
            sorted(c["name"] for c in insp.get_columns(t)),
            sorted(
                (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                for i in insp.get_indexes(t)
            ),
        )
        for t in sorted(insp.get_table_names())
    }


def test_the_tables_are_those_of_their_schema_version(tmp_path: Path) -> None:
    Store(f"sqlite:///{tmp_path / 'state.db'}").close()
    assert SCHEMA_VERSION in SCHEMAS, (
        f"add schema version {SCHEMA_VERSION}'s tables to SCHEMAS (and its migration step)"
    )
    assert tables_of(tmp_path / "state.db") == SCHEMAS[SCHEMA_VERSION], (
        "the tables changed: bump SCHEMA_VERSION, add the step to store.migrate.MIGRATIONS "
        "and the new version's tables here"
    )
