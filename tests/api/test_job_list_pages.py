"""`GET /v1/jobs` a page at a time: a list cut at its `limit` says so (`more`, `next_before`),
and `before` asks for the next page. Before: the list was cut silently at `limit` and no page
past it could be asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from aisched.service.routes import jobs as job_routes


def _submit(client: TestClient, tmp_path: Path, count: int) -> list[str]:
    ids = []
    for i in range(count):
        r = client.post(
            "/v1/jobs",
            json={"name": f"j{i}", "command": ["true"]},
            params={"workdir": str(tmp_path)},
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids[::-1]  # newest first, as listed


def _page(client: TestClient, **params: Any) -> tuple[list[str], bool, str | None]:
    r = client.get("/v1/jobs", params={"all": "true", **params})
    assert r.status_code == 200, r.text
    body = r.json()
    return [j["id"] for j in body["jobs"]], body["more"], body["next_before"]


def _every_page(client: TestClient, limit: int) -> list[tuple[list[str], bool, str | None]]:
    pages = [_page(client, limit=limit)]
    while pages[-1][1]:
        pages.append(_page(client, limit=limit, before=pages[-1][2]))
    return pages


def test_a_cut_list_says_so_and_the_next_pages_follow(client: TestClient, tmp_path: Path) -> None:
    ids = _submit(client, tmp_path, 5)
    assert _every_page(client, 2) == [
        (ids[0:2], True, ids[1]),
        (ids[2:4], True, ids[3]),
        (ids[4:5], False, None),
    ]
    # Exactly `limit` jobs match: nothing more, and nothing cut.
    assert _page(client, limit=5) == (ids, False, None)
    assert _page(client, limit=4, before=ids[0]) == (ids[1:], False, None)
    # A forgotten (or never given) ID under the newest still starts a page below it.
    assert _page(client, limit=10, before=str(int(ids[0]) + 100)) == (ids, False, None)
    r = client.get("/v1/jobs", params={"before": "1/../2"})
    assert r.status_code == 422, r.text
    assert "before: '1/../2' is not a job ID" in r.text


def test_a_list_streamed_page_by_page_says_it_was_cut_too(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `limit` over the store's page is written as it is read (in pages of LIST_PAGE, 2
    here); the answer ends with the same fields."""
    monkeypatch.setattr(job_routes, "LIST_PAGE", 2)
    ids = _submit(client, tmp_path, 8)
    assert _every_page(client, 5) == [(ids[0:5], True, ids[4]), (ids[5:8], False, None)]
    assert _every_page(client, 4) == [(ids[0:4], True, ids[3]), (ids[4:8], False, None)]
    assert _page(client, limit=8) == (ids, False, None)
    assert _page(client, limit=9) == (ids, False, None)
    assert _page(client, limit=3, before=ids[3]) == (ids[4:7], True, ids[6])


def test_a_live_list_whose_last_jobs_end_between_two_pages_is_still_json(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs left ended between two pages' reads: an empty page was written with its
    comma, `[...},]`, which no JSON reader takes (a test's listing after a cancel hit it)."""
    monkeypatch.setattr(job_routes, "LIST_PAGE", 2)
    blocker = client.post(
        "/v1/jobs", json={"command": ["sleep", "60"], "resources": {"gpus": 4}}
    ).json()["id"]
    waiting = [
        client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 4}}).json()["id"]
        for _ in range(3)
    ]
    real = job_routes._job_list

    def cancel_after_the_first_page(pages: Any, mine: Any, next_before: list[str]) -> Any:
        def cancelling() -> Any:
            for i, rows in enumerate(pages):
                yield rows
                if i == 0:  # the one left ends before the next page is read
                    assert client.post(f"/v1/jobs/{waiting[0]}/cancel").status_code == 202

        return real(cancelling(), mine, next_before)

    monkeypatch.setattr(job_routes, "_job_list", cancel_after_the_first_page)
    r = client.get("/v1/jobs", params={"limit": 10, "state": "pending"})
    assert r.status_code == 200
    assert [j["id"] for j in r.json()["jobs"]] == waiting[::-1][:2]
    assert blocker not in {j["id"] for j in r.json()["jobs"]}
