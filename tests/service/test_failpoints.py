"""A failpoint stops the service at its place: nothing after it runs until the process is
continued. Fault tests rely on it (a gang's launch cut between its tasks, a leader paused
between committing a launch and making it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aisched.service import failpoints

# A failpoint hit in a worker thread while the main thread sleeps, as the scheduling loop's
# thread hits it while the web server's waits for requests.
CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    from aisched.service import failpoints

    out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)

    def worker() -> None:
        failpoints.hit(failpoints.PAUSE_MID_LAUNCH)
        os.write(out, b"x")  # at once, as the launch went on to start the next task

    threading.Thread(target=worker).start()
    time.sleep(60)
    """
)


def state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def wait_until(what: str, check: object, timeout_s: float = 20.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_nothing_after_a_failpoint_runs_before_the_process_is_continued(tmp_path: Path) -> None:
    # The SIGSTOP was sent to the process: the kernel hands it to the main thread, which stops
    # the others once it is scheduled, and the thread at the failpoint ran on meanwhile (it did
    # here on every try; a gang's second task was started past the "pause").
    after = tmp_path / "after"
    env = {**os.environ, failpoints.ENV: failpoints.PAUSE_MID_LAUNCH}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(after)], env=env)
    try:
        wait_until("the child to stop", lambda: state(child.pid) == "T")
        time.sleep(0.2)  # room for a thread that did not stop to get on
        assert after.read_bytes() == b"", "the code after the failpoint ran while stopped"
        child.send_signal(signal.SIGCONT)
        wait_until("the code after the failpoint to run once continued", after.read_bytes)
    finally:
        child.kill()
        child.wait()


def test_an_unarmed_failpoint_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.hit(failpoints.PAUSE_MID_LAUNCH)  # returns: this process is not stopped
