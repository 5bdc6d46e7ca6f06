"""Durable state: jobs, tasks and the event log, in SQLite (default) or PostgreSQL."""

from aisched.store.db import Store, StoreError, Tx

__all__ = ["Store", "StoreError", "Tx"]
