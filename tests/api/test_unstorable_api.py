"""A command that brings a value the store cannot hold fails alone: its caller gets 422 with
what the store said, and the loop carries on with the commands behind it (SQLite and
PostgreSQL). The value is put on the job below the API's validation, which refuses it first:
this is the defence for a value that some day slips past validation, not a way in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from clients import client_for
from test_faults_api import ids, until
from test_store_stopped_api import answered

from aisched.model.job import Dependency, DependencyCondition
from aisched.service.app import Service
from aisched.service.identity import service_user
from aisched.service.loop import Rejected
from aisched.testing.builders import job
from aisched.testing.fakes import FakeExecutor

OpenService = Callable[..., Service]  # the open_service fixture of conftest.py

# An integer past 64 bits: sqlite3 cannot bind it (OverflowError), PostgreSQL refuses it for an
# integer column (integer out of range).
PAST_64_BITS = 2**70


def test_a_submission_the_store_cannot_hold_is_refused_and_holds_nothing_back(
    open_service: OpenService, fx: FakeExecutor
) -> None:
    svc = open_service(fx)
    client = client_for(svc)
    sched = svc.scheduler
    unstorable = job("").name("huge").task(1, cpu=0.1).priority(PAST_64_BITS)
    refused = sched.submit(unstorable.user(service_user()).build())
    after = answered(lambda: client.post("/v1/jobs", json={"name": "after", "command": ["true"]}))

    assert after.status_code == 201
    with pytest.raises(Rejected) as why:
        refused.result(timeout=30)
    assert why.value.status == 422
    assert str(why.value).startswith("not stored: the store cannot hold a value of this request (")
    assert str(why.value).endswith("nothing of it was kept: correct it and send it again")
    assert ids(client) == [after.json()["id"]]  # nothing of the refused one
    running = f"/v1/jobs/{after.json()['id']}"
    until("the next job to run", lambda: client.get(running).json()["state"] == "running")
    assert client.get("/v1/readyz").status_code == 200
    assert [launch.key[0] for launch in fx.launched] == [after.json()["id"]]
    assert sched.step_errors.total == 0  # the step did not fail: the command did
    assert list(sched.jobs) == [after.json()["id"]]


def test_a_file_of_jobs_with_one_the_store_cannot_hold_is_refused_whole(
    open_service: OpenService, fx: FakeExecutor
) -> None:
    svc = open_service(fx)
    client = client_for(svc)
    first = job("").name("first").task(1, cpu=0.1).user(service_user()).build()
    second = job("").name("second").task(1, cpu=0.1).user(service_user())
    together = svc.scheduler.submit_all(
        ((first, "native", ()), (second.priority(PAST_64_BITS).build(), "native", ()))
    )
    with pytest.raises(Rejected) as why:
        together.result(timeout=30)
    assert why.value.status == 422
    after = client.post("/v1/jobs", json={"name": "after", "command": ["true"]})
    assert after.status_code == 201
    assert ids(client) == [after.json()["id"]]  # neither of the file's jobs
    assert list(svc.scheduler.jobs) == [after.json()["id"]]


def test_a_pipeline_with_a_step_the_store_cannot_hold_is_refused_whole(
    open_service: OpenService, fx: FakeExecutor
) -> None:
    # Each step is ended as never stored, in no set order; each waits on the one before, so
    # ending one must not end the steps after it first (as broken dependents: they would end
    # twice) nor release the last (`condition: any`) to run. A chain of 8: a cascade is met
    # in every order but one of the 40320.
    svc = open_service(fx)
    client = client_for(svc)
    steps = [job("").name("s0").task(1, cpu=0.1).user(service_user()).build()]
    for i in range(1, 8):
        depends = Dependency(
            f"s{i - 1}", DependencyCondition.ANY if i == 7 else DependencyCondition.SUCCESS
        )
        priority = PAST_64_BITS if i == 7 else 0
        built = job("").name(f"s{i}").task(1, cpu=0.1).user(service_user()).priority(priority)
        steps.append(replace(built.build(), depends_on=(depends,)))
    together = svc.scheduler.submit_all(tuple((j, "native", ()) for j in steps))
    with pytest.raises(Rejected) as why:
        together.result(timeout=30)
    assert why.value.status == 422
    after = client.post("/v1/jobs", json={"name": "after", "command": ["true"]})
    assert after.status_code == 201
    assert ids(client) == [after.json()["id"]]  # none of the pipeline's jobs
    assert list(svc.scheduler.jobs) == [after.json()["id"]]
    assert svc.scheduler.step_errors.total == 0
    assert svc.scheduler.terminal_counts.get("cancelled", 0) == 0  # counted nowhere
