"""Cycle actions: enqueue, allocate, preempt, reclaim, backfill."""
