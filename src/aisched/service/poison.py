"""The job a scheduling cycle fails on: a bug in the core or in a plugin that only one job's
shape or spec sets off must not stop every other user's jobs. The cycle is pure (the same
inputs give the same result, and nothing is changed), so the loop may run it again on parts of
the pending list: halving finds the one job it fails on alone, in at most 2·log2(n) + 1 runs.
The loop then holds that job back for a while (`HOLD_S`) and runs the cycle without it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aisched.core.snapshot import PendingJob
from aisched.service.step_errors import one_line

# How long a job the cycle fails on is left out of cycles before it is tried again: a bug
# stays until the service is upgraded, so trying every few minutes costs little and a fix (or
# a change in what is running that the failure depended on) is picked up without a restart.
HOLD_S = 300.0
# At most this many jobs are held back for one cycle; past it the failure is not one job's.
MAX_HELD_PER_CYCLE = 8


def a_bug(error: Exception) -> str:
    """How a job's status names a bug met on it: the traceback is in the log."""
    return f"a bug, logged: {type(error).__name__}: {one_line(error)}"


def failure_of(
    run: Callable[[Sequence[PendingJob]], object], part: Sequence[PendingJob]
) -> Exception | None:
    """What `run(part)` raised, or None if it ran."""
    try:
        run(part)
    except Exception as exc:  # any error is the cycle's failure: that is what is sought
        return exc
    return None


def job_it_fails_on(
    run: Callable[[Sequence[PendingJob]], object], pending: Sequence[PendingJob]
) -> tuple[PendingJob, Exception] | None:
    """The one job of `pending` (a list `run` failed on) that `run` fails on alone, with its
    error; None when `run` fails with no pending job at all (the running jobs or the nodes set
    it off), or only on a mix of jobs and on neither half."""
    if failure_of(run, ()) is not None:
        return None
    part = list(pending)
    error: Exception | None = None
    while len(part) > 1:
        half = len(part) // 2
        if (error := failure_of(run, part[:half])) is not None:
            part = part[:half]
        elif (error := failure_of(run, part[half:])) is not None:
            part = part[half:]
        else:
            return None
    if not part:
        return None
    if error is None:  # one job to start with: it failed, but its error was not kept
        error = failure_of(run, part)
        if error is None:
            return None
    return part[0], error
