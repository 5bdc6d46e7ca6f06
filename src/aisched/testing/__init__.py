"""Builders and helpers for tests, shipped with the package so other projects can use them."""

from aisched.testing.builders import JobBuilder, NodeBuilder, cluster, job, node, pending

__all__ = ["JobBuilder", "NodeBuilder", "cluster", "job", "node", "pending"]
