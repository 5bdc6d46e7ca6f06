"""Readiness from the disks and the loop's failures, and the data directory's start-up checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from aisched.service import datadir
from aisched.service.app import Service, ServiceError
from aisched.service.config import load_config
from aisched.service.health import Health
from aisched.service.identity import user_name
from aisched.service.step_errors import StepErrors
from aisched.spec import SpecError
from aisched.testing.child import in_child

MIB = 1 << 20


def health(tmp_path: Path, free: dict[str, int | None], errors: StepErrors) -> Health:
    """Over real directories, with the free space each reports chosen by the test."""

    def statvfs(path: str) -> tuple[int | None, int | None, str]:
        got = free[path]
        return (got, None, "") if got is not None else (None, None, "No such file or directory")

    return Health(
        (("data", tmp_path / "a"), ("logs", tmp_path / "b")),
        100 * MIB,
        errors,
        lambda: True,
        refresh_s=0.0,
        statvfs=statvfs,
    )


def test_readiness_names_each_problem_and_the_refusal_its_status(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    errors = StepErrors()
    free: dict[str, int | None] = {str(tmp_path / "a"): 50 * MIB, str(tmp_path / "b"): None}
    h = health(tmp_path, free, errors)
    r = h.check()
    assert (r.ready, r.disk_pressure) == (False, True)
    assert r.problems == (
        f"disk pressure: 50 MiB free for the data directory {tmp_path / 'a'}, below the 100 MiB "
        "it keeps free",
        f"disk pressure: the logs directory {tmp_path / 'b'}: No such file or directory",
    )
    assert h.refusal() == (507, f"the service is not accepting new jobs: {r.problems[0]}")
    free[str(tmp_path / "a")] = 500 * MIB
    (tmp_path / "b").mkdir()  # the same filesystem as a: reported once
    errors.failed(RuntimeError("a bug"), now=1.0)
    r = h.check()
    assert [d.name for d in r.disks] == ["data"]
    assert r.problems == ("the scheduler's step is failing (1 in a row): a bug",)
    assert h.refusal() == (503, f"the service is not accepting new jobs: {r.problems[0]}")
    errors.succeeded()
    assert (h.check().ready, h.refusal()) == (True, None)


def test_a_write_that_failed_for_lack_of_space_is_disk_pressure(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    errors = StepErrors()
    errors.failed(OSError(28, "No space left on device"), now=1.0)
    r = health(tmp_path, {str(tmp_path / "a"): 500 * MIB}, errors).check()
    assert (r.ready, r.disk_pressure, r.problems) == (
        False,
        True,
        ("disk pressure: the store cannot write: [Errno 28] No space left on device",),
    )


def test_too_few_free_inodes_is_disk_pressure_where_the_filesystem_counts_them(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    inodes: list[int | None] = [99]
    h = Health(
        (("data", tmp_path / "a"),),
        100 * MIB,
        StepErrors(),
        lambda: True,
        min_free_inodes=100,
        refresh_s=0.0,
        statvfs=lambda _path: (500 * MIB, inodes[0], ""),
    )
    r = h.check()
    pressure = (
        f"disk pressure: 99 inodes free for the data directory {tmp_path / 'a'}, below the 100 "
        "it keeps free (no new file can be made)"
    )
    assert (r.ready, r.disk_pressure, r.problems) == (False, True, (pressure,))
    assert (h.launch_hold(), h.refusal()) == (
        pressure,
        (507, f"the service is not accepting new jobs: {pressure}"),
    )
    inodes[0] = None  # a filesystem without a fixed number of inodes (btrfs)
    assert (h.check().ready, h.launch_hold()) == (True, None)


def test_a_new_directory_with_a_config_in_it_is_fine(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("port: 1\n")
    (tmp_path / "service.log").write_text("")
    datadir.prepare(tmp_path)
    datadir.prepare(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir()


def test_a_file_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(datadir.DataDirError) as err:
        datadir.prepare(tmp_path / "f")
    assert str(err.value) == (
        f"the data directory {tmp_path / 'f'} is not a directory; give a directory as --data-dir"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(datadir.DataDirError) as err:
        datadir.prepare(theirs)
    assert str(err.value).startswith(f"the data directory {theirs} belongs to ")
    assert str(err.value).endswith(
        "not to root (uid 0); run aisched up as its owner, or give another --data-dir"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the check is a root service's")
@pytest.mark.parametrize(("owner", "mode"), [(65534, 0o755), (0, 0o777)])
def test_a_root_service_refuses_a_data_directory_another_user_could_swap(
    tmp_path: Path, owner: int, mode: int
) -> None:
    # Whoever may change a directory on its way could put a link of theirs in the data
    # directory's place, and have root write (its tasks' logs) where they choose.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, owner, owner)
    shared.chmod(mode)
    with pytest.raises(datadir.DataDirError) as err:
        datadir.prepare(shared / "aisched")
    assert str(err.value) == (
        f"the data directory {shared / 'aisched'} goes through {shared}, a directory another "
        "user may change (not root's, or others may write it): they could have the service "
        "write as root where they choose; give a --data-dir under directories of root's alone"
    )
    shared.chmod(0o1777)  # sticky, as /tmp: others may not replace what is root's there
    os.chown(shared, 0, 0)
    datadir.prepare(shared / "aisched")


@pytest.mark.skipif(os.geteuid() != 0, reason="the check is a root service's")
def test_a_root_service_refuses_a_data_directory_through_another_users_link(
    tmp_path: Path,
) -> None:
    # In a sticky directory others may write (as /tmp), a link's owner may still replace it:
    # one of another user's, the data directory itself or on the way to its target, could be
    # pointed elsewhere once the service runs, and root would write its tasks' logs there.
    sticky, roots = tmp_path / "sticky", tmp_path / "roots"
    sticky.mkdir(mode=0o1777)
    sticky.chmod(0o1777)
    roots.mkdir(mode=0o700)
    (roots / "sub").mkdir()
    theirs = sticky / "theirs"
    theirs.symlink_to(roots)
    os.lchown(theirs, 65534, 65534)
    mine = sticky / "mine"
    mine.symlink_to(roots / "sub")
    datadir.prepare(mine)  # root's own link: no one else may replace it there
    through = sticky / "through"  # root's, but its target goes through theirs
    through.symlink_to(theirs / "sub")
    link = "a link of nobody (uid 65534), who may point it elsewhere (others may write where it is)"
    for home, place in (
        (theirs, f"is {link}"),
        (through, f"goes through {theirs}, {link}"),
        (theirs / "sub", f"goes through {theirs}, {link}"),
    ):
        with pytest.raises(datadir.DataDirError) as err:
            datadir.prepare(home)
        assert str(err.value) == (
            f"the data directory {home} {place}: they could have the service write as root "
            "where they choose; give a --data-dir under directories of root's alone"
        )


@pytest.mark.parametrize(
    ("entry", "there", "wanted"),
    [
        ("tasks", "a file", "a directory"),
        ("logs", "a file", "a directory"),
        ("state.db", "a directory", "a file"),
        ("lock", "a directory", "a file"),
    ],
)
def test_an_entry_of_the_wrong_kind_in_the_data_directory_is_named(
    tmp_path: Path, entry: str, there: str, wanted: str
) -> None:
    # Each was a traceback (tasks) or "the data directory is not writable" (the rest).
    home = tmp_path / "home"
    home.mkdir()
    (home / "lock").write_text("")  # an aisched data directory
    if there == "a file":
        (home / entry).write_text("")
    else:
        (home / entry).unlink(missing_ok=True)
        (home / entry).mkdir()
    cfg = load_config(None, {"data_dir": str(home), "node": {"gpus": 1}})
    with pytest.raises(ServiceError) as err:
        Service.open(cfg).close()
    assert str(err.value) == (
        f"{home / entry} is {there}, where aisched keeps {wanted} of its own; move it out of "
        "the data directory, or give another --data-dir"
    )


@pytest.mark.parametrize(
    ("free", "keep", "said"),
    [
        # Each was said in a format of its own: `15.0 GiB`, `1024.0 GiB`.
        (15 << 30, 1 << 40, "15 GiB free for the data directory D, below the 1 TiB it keeps"),
        (5_123_456_789, 10 << 30, "4886 MiB free for the data directory D, below the 10 GiB"),
        # A limit of part of a MiB: not `1 MiB free, below the 1 MiB`.
        (1_200_000, 1_536_000, "1,200,000 bytes free for the data directory D, below the "),
    ],
)
def test_disk_pressure_says_sizes_as_every_size_is_said(
    tmp_path: Path, free: int, keep: int, said: str
) -> None:
    h = Health(
        (("data", tmp_path),),
        keep,
        StepErrors(),
        lambda: True,
        refresh_s=0.0,
        statvfs=lambda path: (free, None, ""),
    )
    (problem,) = h.check().problems
    assert problem.replace(str(tmp_path), "D").startswith(f"disk pressure: {said}"), problem


def test_a_full_data_directory_at_start_says_sizes_as_every_size_is_said(tmp_path: Path) -> None:
    # It said `only 15360 MiB free, below the 1048576 MiB`.
    assert str(datadir.full(tmp_path, 15 << 30, 1 << 40)) == (
        f"the data directory {tmp_path} has only 15 GiB free, below the 1 TiB that aisched "
        "keeps free (limits.disk_min_free); free some space, or lower the limit"
    )


def test_keeping_no_space_free_is_written_as_zero_without_a_unit(tmp_path: Path) -> None:
    path = tmp_path / "aisched.yaml"
    path.write_text("limits:\n  disk_min_free: 0\n  disk_min_free_inodes: 0\n")
    limits = load_config(path).limits
    assert limits.disk_min_free_bytes() == 0
    h = Health(
        (("data", tmp_path),),
        limits.disk_min_free_bytes(),
        StepErrors(),
        lambda: True,
        min_free_inodes=limits.disk_min_free_inodes,
        refresh_s=0.0,
        statvfs=lambda _path: (0, 0, ""),
    )
    assert (h.check().ready, h.refusal()) == (True, None)
    path.write_text("limits:\n  disk_min_free: 5\n")
    with pytest.raises(SpecError, match="limits.disk_min_free: size: 5 has no unit"):
        load_config(path)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://"])
def test_an_in_memory_database_is_refused(tmp_path: Path, url: str) -> None:
    """It was taken: the service made its tables in one connection's database, and every
    step of its loop failed on another's ("no such table: jobs")."""
    path = tmp_path / "aisched.yaml"
    path.write_text(f"database: '{url}'\n")
    with pytest.raises(SpecError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: database: {url!r} is an in-memory SQLite database, which holds nothing the "
        "service could find again: give a file (sqlite:////path/state.db), or leave it out"
    )


def test_a_database_file_in_a_missing_directory_is_named_not_the_data_directory(
    tmp_path: Path,
) -> None:
    # It said "the data directory ... is not writable (No such file or directory)".
    missing = tmp_path / "missing" / "state.db"
    home = tmp_path / "home"
    cfg = load_config(
        None, {"data_dir": str(home), "database": f"sqlite:///{missing}", "node": {"gpus": 1}}
    )
    with pytest.raises(ServiceError) as err:
        Service.open(cfg).close()
    assert str(err.value) == (
        f"cannot create the state database {missing}: No such file or directory; give a "
        "database file (--database, or database: in the config file) in a directory that "
        "exists and this service may write"
    )


def _prepare_as(uid: int, home: Path) -> str:
    """`datadir.prepare(home)` in a child process running as `uid`: its refusal, or "ok"."""

    def prepare() -> str:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        try:
            datadir.prepare(home)
        except datadir.DataDirError as e:
            return str(e)
        return "ok"

    return in_child(prepare)


@pytest.mark.skipif(os.geteuid() != 0, reason="making other users' links needs root")
def test_a_users_service_refuses_a_data_directory_through_another_users_link() -> None:
    # Through a link of another user's in a sticky directory (as /tmp), that user could point
    # the data directory at one of theirs once the service runs, and read the jobs'
    # checkpoints there (an ordinary user's service was not checked at all).
    me, other = 65534, 65533
    top = Path(tempfile.mkdtemp(prefix="ais-datadir-"))
    try:
        top.chmod(0o755)
        sticky, mine = top / "sticky", top / "mine"
        sticky.mkdir()
        sticky.chmod(0o1777)
        mine.mkdir()
        os.chown(mine, me, me)
        theirs = sticky / "theirs"
        theirs.symlink_to(mine)
        os.lchown(theirs, other, other)
        assert _prepare_as(me, mine / "data") == "ok"
        assert _prepare_as(me, theirs / "data") == (
            f"the data directory {theirs / 'data'} goes through {theirs}, a link of uid {other}, "
            "who may point it elsewhere (others may write where it is): they could read or "
            "replace the jobs' checkpoints and logs; give a --data-dir under directories of "
            "yours (or root's) alone"
        )
        open_dir = top / "open"
        open_dir.mkdir()
        open_dir.chmod(0o777)  # no sticky bit: anyone may rename what is in it
        assert _prepare_as(me, open_dir / "data").startswith(
            f"the data directory {open_dir / 'data'} goes through {open_dir}, a directory "
            "another user may change (not yours or root's, or others may write it)"
        )
    finally:
        shutil.rmtree(top)


def _open_as(uid: int, home: Path) -> str:
    """`Service.open` of a service on `home` in a child process running as `uid`: its
    refusal, or "ok"."""

    cfg = load_config(None, {"data_dir": str(home), "node": {"gpus": 1}})
    # Once as this process's user first, elsewhere: the modules a start imports are loaded
    # before the child may no longer read the interpreter's library.
    Service.open(
        load_config(None, {"data_dir": str(home.parent / "warm"), "node": {"gpus": 1}})
    ).close()

    def start() -> str:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        os.environ["HOME"] = str(home.parent)  # a close looks at the default data directory
        try:
            Service.open(cfg).close()
        except ServiceError as e:
            return str(e)
        return "ok"

    return in_child(start)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to other users needs root")
@pytest.mark.parametrize(
    ("suffix", "what"), [("-wal", "write-ahead log"), ("-shm", "shared memory")]
)
def test_a_database_side_file_of_another_user_is_named(suffix: str, what: str) -> None:
    # It said "the state database .../state.db cannot be opened for writing (attempt to
    # write a readonly database)" of a database its user could write, or started on it.
    me = 65534
    top = Path(tempfile.mkdtemp(prefix="ais-datadir-"))
    try:
        top.chmod(0o755)
        home = top / "data"
        home.mkdir()
        os.chown(home, me, me)
        assert _open_as(me, home) == "ok"
        side = home / f"state.db{suffix}"
        side.write_bytes(b"")  # root's now, readable by all, writable by root alone
        side.chmod(0o644)
        assert _open_as(me, home) == (
            f"the state database's {what} file {side} cannot be written (Permission denied): "
            f"it belongs to root (uid 0), not to {user_name(me)} (uid {me}) who runs aisched; "
            f"give it back (as root: chown {user_name(me)} {side}), or run aisched up as its owner"
        )
    finally:
        shutil.rmtree(top)


def test_an_immutable_database_is_named_not_the_data_directory(tmp_path: Path) -> None:
    # It said "the data directory ... is not writable (Operation not permitted)".
    home = tmp_path / "home"
    cfg = load_config(None, {"data_dir": str(home), "node": {"gpus": 1}})
    Service.open(cfg).close()
    db = home / "state.db"
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is refused here (not root, or a filesystem without it)")
    try:
        with pytest.raises(ServiceError) as err:
            Service.open(cfg).close()
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    assert str(err.value) == (
        f"the state database {db} cannot be written (Operation not permitted): it is marked "
        f"immutable or append-only (lsattr {db} shows i or a); clear that as root "
        f"(chattr -i -a {db})"
    )
