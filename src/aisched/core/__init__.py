"""The scheduling brain. Pure: a snapshot and the pending jobs in, decisions out.

Nothing in this package reads a clock, touches a file or socket, or draws unseeded random
numbers. numpy is used for the per-node hot path.
"""
