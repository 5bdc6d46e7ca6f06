"""A user's checkpoint directory (`~USER/.aisched/checkpoints/INSTANCE-JOBID`) under root's
`aisched up`, where another local user had a hand in it.

What it shows: a host task refuses a checkpoint directory that another user made (or a link),
and one in a directory another user could change (a planted ~/.aisched, a checkpoints
directory others may write): that user could read or change its checkpoints, or swap the
directory for one of theirs once checked. The task never runs, and its job says why in one
line. A container task's checkpoint directory is looked up by its user, not by root: what
is refused tells that user nothing of a path it may not see.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from container_image import build_test_image, missing_tools
from harness import Service, local_service
from users import GROUP, User

pytestmark = pytest.mark.usefixtures("local_users")

# The container tests here run root's podman (CI runs as root).
rootful_podman = pytest.mark.skipif(
    (why := missing_tools()) is not None or os.geteuid() != 0,
    reason=why or "the container tests run rootful podman (CI runs as root)",
)

# What the jobs here save, and how a host job saves it.
SAVED = "alice's weights"
SAVE = f'echo "{SAVED}" > "$AISCHED_CHECKPOINT_DIR/state"'


@pytest.fixture
def service(tmp_path: Path, local_users: dict[str, User]) -> Iterator[Service]:
    """Root's service; alice's ~/.aisched removed before and after (each test plants its own)."""
    tmp_path.chmod(0o755)  # the users' jobs run in their homes
    aisched = local_users["alice"].home / ".aisched"
    subprocess.run(["rm", "-rf", "--", str(aisched)], check=True)
    try:
        with local_service(tmp_path) as svc:
            yield svc
    finally:
        subprocess.run(["rm", "-rf", "--", str(aisched)], check=True)


def submit(svc: Service, user: User, command: str, image: str | None = None) -> str:
    """The id of a job of `user`'s running `command` (never restarted); a container job
    works in /tmp (its checkpoint directory not inside the mounted working directory)."""
    spec = f"command: {json.dumps(command)}\nrestart: {{policy: never}}\n"
    if image is not None:
        spec += f"image: {image}\nworkdir: /tmp\n"
    (user.home / "job.yaml").write_text(spec)
    proc = user.aisched(
        "submit", "--json", str(user.home / "job.yaml"),
        env={"AISCHED_SERVER": f"unix:{svc.socket}"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["id"])


def next_checkpoint_dir(svc: Service, user: User, image: str | None = None) -> tuple[str, Path]:
    """The id and checkpoint directory of `user`'s next job, once a first one has run (and
    made ~/.aisched/checkpoints, its user's)."""
    first = submit(svc, user, "true", image)
    svc.wait_state(first, "succeeded", timeout_s=60)
    nxt = str(int(first) + 1)
    return nxt, Path(svc.job(first)["checkpoint_dir"].removesuffix(f"-{first}") + f"-{nxt}")


def checkpoints_at(user: User, ckpt: Path, target: Path) -> None:
    """`user`'s checkpoints directory (the parent of `ckpt`) made a link of theirs to
    `target`."""
    shutil.rmtree(ckpt.parent)
    ckpt.parent.symlink_to(target)
    os.lchown(ckpt.parent, user.uid, user.gid)


def as_user(user: User, *argv: str) -> None:
    done = subprocess.run(user.cmd(*argv), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def refused(svc: Service, jid: str) -> str:
    """The message of job `jid`, which must have failed (not succeeded)."""
    job = svc.wait_state(jid, "failed", "succeeded", timeout_s=60)
    assert job["state"] == "failed", f"job {jid} ran: {job['message']}"
    return str(job["message"])


def test_a_checkpoint_directory_another_user_made_is_refused_by_a_host_task(
    service: Service, local_users: dict[str, User]
) -> None:
    # alice's checkpoints directory is shared like /tmp (sticky: nobody may rename hers), and
    # bob made her next job's directory first, open to her. Before, her job saved there.
    alice, bob = local_users["alice"], local_users["bob"]
    jid, ckpt = next_checkpoint_dir(service, alice)
    ckpt.parent.chmod(0o1777)
    as_user(bob, "mkdir", "-m", "777", "--", str(ckpt))
    got = submit(service, alice, SAVE)
    assert got == jid
    assert refused(service, jid) == (
        f"task main-0 checkpoint directory {ckpt} belongs to uid {bob.uid}, not to the task's "
        f"user (uid {alice.uid}): refused; remove it; restart policy is never"
    )
    assert list(ckpt.iterdir()) == []  # nothing of hers for bob to read


@pytest.mark.parametrize("planted", ["checkpoints open to all", "~/.aisched of bob's"])
def test_a_checkpoint_directory_another_user_could_swap_is_refused_by_a_host_task(
    service: Service, local_users: dict[str, User], planted: str
) -> None:
    # Her own directory, made by her job, but in one bob may change: once it is checked, bob
    # could rename it away and put his in its place. Before, her job ran and saved there.
    alice, bob = local_users["alice"], local_users["bob"]
    checkpoints = alice.home / ".aisched" / "checkpoints"
    if planted == "checkpoints open to all":
        next_checkpoint_dir(service, alice)  # ~/.aisched/checkpoints made, hers
        checkpoints.chmod(0o777)
        way, why = checkpoints, "may be written by others (mode 777)"
    else:  # bob put it there when her home was his to write: a directory he lets her write
        way = checkpoints.parent
        way.mkdir()
        way.chmod(0o777)
        os.chown(way, bob.uid, bob.gid)
        why = f"belongs to uid {bob.uid}"
    jid = submit(service, alice, SAVE)
    message = refused(service, jid)
    ckpt = Path(service.job(jid)["checkpoint_dir"])
    assert message == (
        f"task main-0 checkpoint directory {ckpt}: {way} {why}, so another user could swap "
        f"the directory for one of theirs: refused; the task's user (uid {alice.uid}) and "
        "root alone must own and write each directory on its way; restart policy is never"
    )
    assert not (ckpt / "state").exists()


def test_a_checkpoint_directory_of_her_own_in_her_own_home_is_used(
    service: Service, local_users: dict[str, User]
) -> None:
    # The usual case, through a link of hers on the way (~/.aisched on a disk of hers).
    alice = local_users["alice"]
    elsewhere = Path(tempfile.mkdtemp(prefix="ais-"))
    try:
        elsewhere.chmod(0o755)
        os.chown(elsewhere, alice.uid, alice.gid)
        (alice.home / ".aisched").symlink_to(elsewhere)
        os.lchown(alice.home / ".aisched", alice.uid, alice.gid)
        jid = submit(service, alice, SAVE)
        job = service.wait_state(jid, "succeeded", "failed", timeout_s=60)
        assert job["state"] == "succeeded", job["message"]
        saved = Path(job["checkpoint_dir"]) / "state"
        assert (saved.read_text(), saved.owner()) == (f"{SAVED}\n", alice.name)
        assert saved.resolve().is_relative_to(elsewhere)
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@rootful_podman
def test_a_container_tasks_refusal_tells_the_user_nothing_of_what_it_may_not_see(
    service: Service, local_users: dict[str, User]
) -> None:
    # alice points ~/.aisched/checkpoints at a directory of root's she may not enter, and asks
    # for two container jobs whose checkpoint directories would be in it: one name that exists
    # there, one that does not. Before, root looked them up for her: "belongs to uid 0" for
    # the one that exists, "cannot make" for the other.
    image = build_test_image()
    alice = local_users["alice"]
    jid, ckpt = next_checkpoint_dir(service, alice, image)
    secret = Path(tempfile.mkdtemp(prefix="ais-"))  # root's, 0700
    try:
        (secret / ckpt.name).mkdir()
        checkpoints_at(alice, ckpt, secret)
        messages: list[str] = []
        for expected in (jid, str(int(jid) + 1)):
            got = submit(service, alice, "true", image)
            assert got == expected
            path = ckpt.parent / f"{ckpt.name.removesuffix(f'-{jid}')}-{got}"
            messages.append(refused(service, got).replace(str(path), "CKPT"))
        assert messages[0] == messages[1], messages
        assert messages[0].startswith("task main-0 cannot make CKPT: ")
        assert "Permission denied" in messages[0]
        assert sorted(os.listdir(secret)) == [ckpt.name]
    finally:
        shutil.rmtree(secret, ignore_errors=True)


@rootful_podman
def test_a_container_tasks_checkpoint_directory_is_made_with_its_users_groups(
    service: Service, local_users: dict[str, User]
) -> None:
    # alice's checkpoints live in her directory of a team disk she enters as a member of the
    # team's group (root:aisteam 0750). Before, the directory was made as her without her
    # supplementary groups: "Permission denied", and the job failed.
    image = build_test_image()
    alice = local_users["alice"]
    jid, ckpt = next_checkpoint_dir(service, alice, image)
    team = Path(tempfile.mkdtemp(prefix="ais-team-"))
    try:
        os.chown(team, 0, grp.getgrnam(GROUP).gr_gid)
        team.chmod(0o750)
        mine = team / "alice"
        mine.mkdir(mode=0o700)
        os.chown(mine, alice.uid, alice.gid)
        checkpoints_at(alice, ckpt, mine)
        got = submit(service, alice, "true", image)
        assert got == jid
        job = service.wait_state(jid, "succeeded", "failed", timeout_s=120)
        assert job["state"] == "succeeded", job["message"]
        made = mine / ckpt.name
        assert (made.is_dir(), made.owner(), oct(made.stat().st_mode & 0o777)) == (
            True,
            alice.name,
            "0o700",
        )
    finally:
        shutil.rmtree(team, ignore_errors=True)
