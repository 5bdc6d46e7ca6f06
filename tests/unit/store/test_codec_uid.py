"""The submitter's uid survives the store, so a job relaunched after a restart still runs as
that account or not at all; a row stored before the uid was kept still loads, without one."""

from __future__ import annotations

from aisched.model.job import Job, TaskGroup
from aisched.model.resources import Resources
from aisched.store.codec import job_from_dict, job_to_dict


def test_the_submitters_uid_round_trips_and_an_older_row_has_none() -> None:
    job = Job("1", (TaskGroup("w", 1, Resources(milli_cpu=1000), ("true",)),), user="a", uid=1005)
    stored = job_to_dict(job)
    assert stored["uid"] == 1005
    assert job_from_dict(stored) == job
    del stored["uid"]  # as rows written before it was recorded
    assert job_from_dict(stored).uid is None
