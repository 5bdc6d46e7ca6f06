"""The tables of the service's durable state (SQLAlchemy Core; SQLite by default, PostgreSQL
through the same definitions).

- `jobs`: one row per submitted job, deleted (with its tasks and events) only once it has
  ended more than `limits.keep_ended` ago (`service.retention`), the newest job never. `id`
  is the decimal form of `seq`, so ids are short and ordered (`aisched show 42`). `spec` is the
  job as submitted (the model `Job`, encoded by `store.codec`), fixed once written; every other
  column is the job's live state.
- `tasks`: one row per task per attempt, `(job_id, attempt, name)`. A row is written (state
  `launching`) *before* the task is started and carries the executor's handle once it runs, so
  a restarted scheduler can find every task it may have started.
- `events`: the append-only log of every state change, in commit order.
- `meta`: the schema version (`store.migrate` brings an older database up to it).
- `tokens`: API bearer tokens, stored only as a SHA-256 of the secret (the secret is shown
  once, at creation), and of the dashboard cookie made from it (`service.tokens`). Written by
  the API threads, never by the loop: no job state lives here.
- `audit`: who did what to whose job and when (cancellations, admin actions, token changes);
  append-only, written by the API threads; rows older than `limits.keep_audit` are deleted
  (`service.retention`).
- `leader`: one row (id 1), the lease of the instance that schedules (`store.lease`): its
  holder, the address of its API, its term (the fencing token every write of the leader is
  checked against) and when the lease expires, in the database's clock.

Changing a table means: bump `SCHEMA_VERSION` and add the step from the previous version to
`store.migrate.MIGRATIONS` (`tests/unit/store/test_schema_versions.py` holds each version's
columns and indexes, and fails on a change made without a new version). Version 6 changed no
table: it adds `tokens.read_only` to the databases of the first releases of version 5. Version
7 adds `jobs.quick_exits`, version 8 `tokens.cookie_digest` and `tokens.uid`.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

SCHEMA_VERSION = 8

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("id", String(32), nullable=False, unique=True),
    Column("name", String(128), nullable=False),
    Column("user", String(128), nullable=False),
    Column("queue", String(128), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("format", String(16), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("state", String(16), nullable=False),
    Column("submitted_at", Float, nullable=False),
    Column("started_at", Float),  # first start
    Column("attempt_started_at", Float),
    Column("finished_at", Float),
    Column("attempt", Integer, nullable=False, default=0),
    Column("failures", Integer, nullable=False, default=0),
    Column("preemptions", Integer, nullable=False, default=0),
    # Schema 7: quick clean exits in a row under `restart: always` (`lifecycle.attempts`), so
    # the doubling wait before the next restart goes on where it was after a scheduler restart.
    Column("quick_exits", Integer, nullable=False, server_default="0"),
    Column("not_before", Float),
    Column("stopping", String(16)),
    Column("waiting_for", JSON),
    Column("reason_code", String(32)),
    Column("reason", Text),
    Column("eta", Float),
    Column("predicted_s", Float),  # the predictor's median runtime, when it was last pending
    Column("predicted_upper_s", Float),
    Column("exit_code", Integer),
    Column("message", Text),
    Column("attained_gpu_s", Float, nullable=False, default=0.0),
    Column("checkpoint_dir", Text, nullable=False),
    Column("warnings", JSON),
    # The client's Idempotency-Key of the submission that made the job (schema 2): a retried
    # submission with the same key and user gets this job back instead of a second one.
    Column("idempotency_key", String(256)),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_idempotency", "user", "idempotency_key", unique=True),
    Index("ix_jobs_finished", "finished_at"),  # schema 5: which ended jobs to forget
)

tasks = Table(
    "tasks",
    metadata,
    Column("job_id", String(32), ForeignKey("jobs.id"), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("name", String(160), primary_key=True),
    Column("rank", Integer, nullable=False),
    Column("grp", String(128), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("node", String(256), nullable=False),
    Column("gpus", JSON, nullable=False),
    Column("gpu_milli", Integer, nullable=False),
    Column("milli_cpu", Integer, nullable=False),
    Column("mem_mib", Integer, nullable=False),
    Column("gpu_mem_mib", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("handle", JSON),
    Column("exit_kind", String(16)),
    Column("exit_code", Integer),
    Column("message", Text),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("log_path", Text, nullable=False),
)

events = Table(
    "events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("job_id", String(32), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Index("ix_events_job", "job_id", "seq"),
)

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", String(32), primary_key=True),  # public: names the token in list/revoke
    Column("digest", String(64), nullable=False, unique=True),
    Column("user", String(128), nullable=False),
    Column("admin", Integer, nullable=False, default=0),
    # Schema 5: a token that may only read (GET); its requests that would change anything are
    # refused whoever it names.
    Column("read_only", Integer, nullable=False, server_default="0"),
    # Schema 8: the SHA-256 of the dashboard cookie's MAC, which only the secret makes; null
    # for a token of an older version until its next dashboard login.
    Column("cookie_digest", String(64)),
    # Schema 8: the uid its user's name had when it was made, or null (no account here then,
    # or made before): a token is refused once the name names another uid (`service.tokens`).
    Column("uid", Integer),
    Column("created_at", Float, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("expires_at", Float),
    Column("revoked_at", Float),
    Column("note", Text),
)

audit = Table(
    "audit",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("via", String(16), nullable=False),  # socket | token
    Column("action", String(32), nullable=False),
    Column("target", String(160), nullable=False),
    Column("owner", String(128)),
    Column("detail", Text),
)

leader = Table(
    "leader",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1
    Column("holder", String(128), nullable=False),  # "" before anyone has led
    Column("address", Text, nullable=False),
    Column("term", Integer, nullable=False),
    Column("expires_at", Float, nullable=False),  # the database's clock, Unix seconds
)
