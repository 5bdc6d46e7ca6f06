"""Bad input to the live API, generated: the service answers it, never dies of it, loses nothing.

One real service (the real app, store and loop thread over the fake executor; on SQLite, then
on PostgreSQL) takes
valid job documents mutated at one field (a wrong type, a number out of range or not finite, a
long or odd string, deep nesting, an unknown key, a repeated task name, a bad unit), as JSON
or YAML, and bad path ids and query parameters on the other endpoints. After every request:

1. the answer is not a 5xx;
2. a 4xx is a `Problem` document (`error`, `problems`) whose text names the mutated field
   (its key, or its location for query parameters);
3. the service still answers `GET /v1/jobs`;
4. a refused submission left no job behind (the store holds exactly the jobs answered 201).

Derandomized, with a modest example count: the same inputs on every run (2 CPU cores in CI).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from bad_input import DEEP, SETTINGS, Mutation, mutated
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from aisched.service import tokens
from aisched.service.api import create_app
from aisched.service.app import Service
from aisched.service.config import load_config
from aisched.service.identity import service_user
from aisched.testing.fakes import FakeExecutor, fake_node


class Api:
    """The service and an admin's client to it (a short repr: Hypothesis prints it)."""

    def __init__(self, svc: Service, client: TestClient) -> None:
        self.svc, self.client = svc, client

    def __repr__(self) -> str:
        return "Api()"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One service for the module's examples, on each store: PostgreSQL refuses text SQLite
    takes (a NUL)."""
    data = tmp_path_factory.mktemp("fuzz")
    database = None
    if request.param == "postgresql":
        database = request.getfixturevalue("pg_server").create_database()
    cfg = load_config(None, {"data_dir": str(data), "cycle_interval": "0.2s", "database": database})
    svc = Service.open(cfg, executor=FakeExecutor([fake_node(gpus=4)]))
    svc.start()
    secret, _ = tokens.create(
        svc.store, service_user(), admin=True, created_by="test", now=time.time()
    )
    client = TestClient(create_app(svc), headers={"Authorization": f"Bearer {secret}"})
    try:
        yield Api(svc, client)
    finally:
        svc.close()


def _jobs(client: TestClient) -> list[str]:
    r = client.get("/v1/jobs", params={"all": "true", "limit": 100_000})
    assert r.status_code == 200, r.text
    # A service's replicas are jobs the service makes, in its own time: not submissions.
    return [j["id"] for j in r.json()["jobs"] if j["replica_of"] is None]


def _check_answer(r: Any, names: str, task: str | None = None) -> None:
    """No 5xx; a 4xx is a Problem naming one of `names` (keys or locations, "|" between), or,
    when it says the job can never fit, naming the `task` it was refused for."""
    assert r.status_code < 500, f"{r.status_code}: {r.text[:2000]}"
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error", "problems"}, body
        assert isinstance(body["error"], str) and body["error"]
        text = " ".join([body["error"], *body["problems"]])
        if task is not None and "can never fit this cluster" in text:
            assert f"'{task}'" in text, f"{task!r} not in {text[:2000]!r}"
            return
        assert any(n in text for n in names.split("|")), f"{names!r} not in {text[:2000]!r}"


@SETTINGS
@given(m=mutated(), as_yaml=st.booleans())
def test_a_bad_submission_is_refused_at_its_field_and_leaves_no_job(
    api: Api, m: Mutation, as_yaml: bool
) -> None:
    client = api.client
    before = _jobs(client)
    if as_yaml and not m.depth:
        body = yaml.safe_dump(m.doc, allow_unicode=True).encode()
    else:  # NaN and Infinity as Python writes them; JSON is YAML too
        deep = "[" * m.depth + "1" + "]" * m.depth
        body = json.dumps(m.doc).replace(json.dumps(DEEP), deep).encode()
    headers = {"content-type": "application/yaml" if as_yaml else "application/json"}
    r = client.post("/v1/jobs", content=body, headers=headers)
    after = _jobs(client)
    if r.status_code == 201:
        assert not m.invalid, f"an invalid job was taken: {r.text[:2000]}"
        # A wrong value that happens to be a valid one: exactly its jobs were made.
        made = [r.json()["id"], *(j["id"] for j in r.json()["jobs"])]
        assert set(after) - set(before) == set(made)
        return
    _check_answer(r, m.names, m.task)
    assert after == before, "a refused submission left a job behind"


RAW_BODIES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"",
            b"\x00",
            b"\xff\xfe",
            b"null",
            b"[]",
            b"42",
            b'"x"',
            b"{",
            b'{"command": NaN}',
            b'{"command": ["a"], "command": ["b"]}',
            b"{" * 5000,
            b"[" * 100_000,
            b"command: [x]\n" + b"  " * 10 + b"\x00",
            b"a: &a [*a]",
            b"!!python/object/apply:os.system [true]",
            b"jobs: []",
            b"jobs: 5",
            b"---\n---\n",
            b'{"jobs": [{"command": "a", "name": "x"}, {"command": "b", "name": "x"}]}',
            b'{"command": "x", "depends_on": ["zzz"]}',
            b'{"command": "x", "depends_on": [{"job": 5.5}]}',
            b'{"command": "x", "name": "a", "depends_on": ["a"]}',
            b"1" * 5000,
        ]
    ),
)


@SETTINGS
@given(
    body=RAW_BODIES,
    ctype=st.sampled_from(["application/json", "application/yaml", "text/plain", ""]),
)
def test_a_raw_bad_body_is_refused(api: Api, body: bytes, ctype: str) -> None:
    client = api.client
    before = _jobs(client)
    r = client.post("/v1/jobs", content=body, headers={"content-type": ctype})
    after = _jobs(client)
    if r.status_code == 201:
        return
    _check_answer(r, "")
    assert r.json()["problems"] or r.status_code != 422, r.text
    assert after == before, "a refused submission left a job behind"


BAD_IDS = st.one_of(
    st.text(min_size=1, max_size=30).filter(lambda s: "/" not in s and s not in (".", "..")),
    st.sampled_from(
        ["0", "-1", "99999999999999999999999", "1.5", "nan", "\x00", "1\x00", "é", "x" * 3000]
        + ["¹", "٣", "1²"]  # digits to str.isdigit: one was answered 500 (int refused it)
    ),
)
BAD_QUERY = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "-1", "0", "nan", "inf", "1e400", "99999999999999999999", "a\x00", "x,y"]),
)


@st.composite
def bad_request(draw: st.DrawFn) -> tuple[str, str, dict[str, str], str]:
    """(method, url, query, what the refusal must name)."""
    jid = quote(draw(BAD_IDS), safe="")  # as a client sends it
    q = draw(BAD_QUERY)
    return draw(
        st.sampled_from(
            [
                ("GET", f"/v1/jobs/{jid}", {}, ""),
                ("GET", f"/v1/jobs/{jid}/logs", {}, ""),
                ("GET", f"/v1/jobs/{jid}/logs", {"attempt": q}, ""),
                ("GET", f"/v1/jobs/{jid}/logs", {"task": q, "follow": "nope"}, ""),
                ("POST", f"/v1/jobs/{jid}/cancel", {}, ""),
                ("POST", f"/v1/jobs/{jid}/metrics", {}, ""),
                ("POST", f"/v1/tokens/{jid}/revoke", {}, ""),
                ("GET", "/v1/jobs", {"state": q}, "state"),
                ("GET", "/v1/jobs", {"limit": q}, "limit"),
                ("GET", "/v1/jobs", {"all": q}, "all"),
                ("GET", "/v1/jobs", {"queue": q, "user": q}, ""),
                ("GET", "/v1/queues", {"x": q}, ""),
                ("GET", "/v1/nodes", {}, ""),
                ("GET", "/v1/audit", {"limit": q}, "limit"),
                ("GET", "/v1/dashboard", {"since": q}, "since"),
                ("GET", f"/static/{jid}", {}, ""),
            ]
        )
    )


@SETTINGS
@given(req=bad_request())
def test_bad_ids_and_query_parameters_are_answered(
    api: Api, req: tuple[str, str, dict[str, str], str]
) -> None:
    client = api.client
    method, url, query, names = req
    before = _jobs(client)
    r = client.request(method, url, params=query)
    if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
        _check_answer(r, names)
    else:
        assert r.status_code < 500, f"{r.status_code}: {r.text[:2000]}"
    assert _jobs(client) == before


def test_the_service_answers_after_all_of_it(api: Api) -> None:
    svc, client = api.svc, api.client
    assert client.get("/v1/healthz").status_code == 200
    r = client.post("/v1/jobs", json={"command": ["echo", "ok"]})
    assert r.status_code == 201, r.text
    assert r.json()["id"] in _jobs(client)
    assert svc.scheduler is not None
