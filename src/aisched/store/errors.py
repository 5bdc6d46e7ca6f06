"""The store's errors, each with a message of one line that says what is wrong and what to do."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The state database cannot be opened or used (wrong schema, unreadable file...)."""


class Deposed(StoreError):
    """A write of a leader whose term has moved on: another instance leads now, and this
    instance's write was refused whole (nothing of its transaction was stored)."""


class StoreUnanswered(StoreError):
    """The database server took a request and gave no answer within its bound (a stopped or
    stuck server): its connection was closed, as one the server had dropped."""
