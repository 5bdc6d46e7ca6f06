"""The ledger of what each user's ended jobs keep (`limits.user_max_ended_bytes`), on real files:
past the bound a user's oldest ended jobs are named to forget, never their newest nor the
newest job of all, and other users' jobs are not touched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aisched.service import ended_bytes
from aisched.service.ended_bytes import Ended, EndedBytes, disk_bytes

KIB = 1024


def job_with_log(data: Path, job_id: str, size: int) -> None:
    """A job's log of `size` bytes, written as the supervisor writes it."""
    folder = data / "logs" / job_id / "1"
    folder.mkdir(parents=True)
    (folder / "main-0.log").write_bytes(b"x" * size)


def kept_by(data: Path, job_id: str) -> int:
    return disk_bytes(data / "logs" / job_id)


def test_a_users_oldest_ended_jobs_go_first_until_what_is_left_fits(tmp_path: Path) -> None:
    for job_id in ("1", "2", "3", "4", "5"):
        job_with_log(tmp_path, job_id, 100 * KIB)
    each = kept_by(tmp_path, "1") + 10  # its document's 10 bytes beside its files
    ledger = EndedBytes(tmp_path, 2 * each)
    for job_id in ("1", "2", "4"):
        ledger.ended(job_id, "alice", 10)
    ledger.ended("3", "bob", 10)
    assert ledger.over(newest_id="9", at_most=500) == {"alice": ["1"]}
    assert ledger.per_user == {"alice": 2 * each, "bob": each}
    ledger.ended("5", "alice", 10)
    assert ledger.over(newest_id="9", at_most=500) == {"alice": ["2"]}
    assert ledger.over(newest_id="9", at_most=500) == {}


def test_the_newest_ended_job_of_a_user_and_the_newest_job_of_all_are_kept(
    tmp_path: Path,
) -> None:
    job_with_log(tmp_path, "7", 300 * KIB)
    job_with_log(tmp_path, "8", 300 * KIB)
    ledger = EndedBytes(tmp_path, 100 * KIB)
    ledger.ended("8", "alice", 10)  # the newest job (the next id counts from it) ends first
    ledger.ended("7", "alice", 10)
    assert ledger.over(newest_id="8", at_most=500) == {}  # 7 is alice's newest ended job
    # Once a later job is the newest, 8 may go; 7 stays, though over the bound alone.
    assert ledger.over(newest_id="9", at_most=500) == {"alice": ["8"]}
    assert ledger.per_user["alice"] > ledger.most


def test_jobs_forgotten_by_age_count_no_more_and_a_pass_takes_at_most_its_share(
    tmp_path: Path,
) -> None:
    ledger = EndedBytes(tmp_path, 100 * KIB)
    for i in range(1, 7):
        job_with_log(tmp_path, str(i), 60 * KIB)
        ledger.ended(str(i), "alice", 0)
    ledger.over(newest_id="99", at_most=0)  # measured, none taken
    ledger.forgotten(["1", "2"])  # keep_ended took the two oldest
    assert list(ledger.order["alice"]) == ["3", "4", "5", "6"]
    assert ledger.over(newest_id="99", at_most=2) == {"alice": ["3", "4"]}
    assert ledger.over(newest_id="99", at_most=2) == {"alice": ["5"]}
    assert list(ledger.order["alice"]) == ["6"]
    ledger.forgotten(["6"])  # her last: nothing of hers is kept
    assert ("alice" in ledger.order, "alice" in ledger.per_user) == (False, False)
    job_with_log(tmp_path, "7", 60 * KIB)
    ledger.ended("7", "alice", 0)
    assert ledger.over(newest_id="99", at_most=2) == {}
    assert list(ledger.order["alice"]) == ["7"]


def test_files_are_counted_as_they_take_the_disk_and_links_are_not_followed(
    tmp_path: Path,
) -> None:
    big = tmp_path / "elsewhere"
    big.write_bytes(b"y" * (1 << 20))
    job_with_log(tmp_path, "1", 10)
    os.symlink(big, tmp_path / "logs" / "1" / "1" / "link")
    assert 10 < kept_by(tmp_path, "1") < 64 * KIB  # a block or so, the folders and the link
    assert disk_bytes(tmp_path / "logs" / "2") == 0  # not there


def test_recover_measures_again_in_place_of_what_was_known(tmp_path: Path) -> None:
    job_with_log(tmp_path, "1", 100 * KIB)
    job_with_log(tmp_path, "2", 100 * KIB)
    ledger = EndedBytes(tmp_path, 150 * KIB)
    ledger.ended("1", "alice", 0)
    ledger.recover([Ended("1", "alice", 0), Ended("2", "alice", 0)])
    assert ledger.over(newest_id="9", at_most=500) == {"alice": ["1"]}
    off = EndedBytes(tmp_path, 0)  # no bound: nothing is kept, nothing is measured
    off.ended("1", "alice", 0)
    off.recover([Ended("2", "alice", 0)])
    assert (list(off.to_measure), off.kept) == ([], {})


def test_after_a_start_jobs_are_measured_a_few_a_step_and_forgotten_only_when_known_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ended_bytes, "MEASURE_AT_MOST", 1)
    for job_id in ("1", "2", "3"):
        job_with_log(tmp_path, job_id, 100 * KIB)
    ledger = EndedBytes(tmp_path, 150 * KIB)
    ledger.recover(Ended(job_id, "alice", 0) for job_id in ("1", "2", "3"))
    assert ledger.over(newest_id="9", at_most=500) == {}  # only 1 known: it fits
    assert ledger.over(newest_id="9", at_most=500) == {"alice": ["1"]}
    ledger.ended("4", "alice", 0)  # ends meanwhile: measured after those before it
    assert ledger.over(newest_id="9", at_most=500) == {"alice": ["2"]}
    job_with_log(tmp_path, "4", 100 * KIB)
    assert ledger.over(newest_id="9", at_most=500) == {"alice": ["3"]}
    assert not ledger.to_measure
