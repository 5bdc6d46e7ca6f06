"""Jobs in container images, end to end: a real `aisched up`, real podman, an image built here.

The image (`container_image.py`) is imported from files of this machine (busybox-static, the host's
Python), so nothing is pulled. Each test reads what the task saw or did from its log, or
from a hostPath volume, and asserts the whole of it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from container_image import MARKER, MARKER_TEXT, build_test_image, missing_tools
from harness import Service, cancel_all, free_port, local_service, wait_for

from aisched.executors.container import (
    ContainerTask,
    create_args,
    detect_engine,
    remove_container,
    start_args,
)
from aisched.executors.instance import instance_tag
from aisched.model.job import ContainerSpec, NetworkMode, Volume

pytestmark = pytest.mark.skipif(
    (why := missing_tools()) is not None or os.geteuid() != 0,
    reason=why or "the container tests run rootful podman (CI runs as root)",
)


@pytest.fixture(scope="module")
def image() -> str:
    return build_test_image()


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with local_service(tmp_path, "container_pids_limit: 64\n") as s:
        yield s


def logs(svc: Service, job_id: str) -> str:
    return svc.cli("logs", job_id).stdout


def containers_of_job(svc: Service, job_id: str) -> list[str]:
    """The containers (any state) of job `job_id` of this service's scheduler."""
    out = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label=io.aisched.job={job_id}", "--format",
         '{{.Names}} {{index .Labels "io.aisched.instance"}}'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    mine = f"aisched-{instance_of(svc)}-"
    return [w[0] for line in out.splitlines() if (w := line.split()) and w[0].startswith(mine)]


def instance_of(svc: Service) -> str:
    return instance_tag((svc.home / "tasks").resolve())


def test_a_task_sees_the_image_filesystem_not_the_hosts(svc: Service, image: str) -> None:
    assert Path("/etc/os-release").exists()  # on the host
    jid = svc.run(
        "--image", image, "--", "sh", "-c",
        f"cat {MARKER}; ls /etc/os-release 2>/dev/null || echo no os-release here; pwd",
    )  # fmt: skip
    svc.wait_state(jid, "succeeded")
    # The working directory is the submitter's, mounted at the same path.
    assert logs(svc, jid) == f"{MARKER_TEXT}no os-release here\n{svc.work}\n"


def test_a_task_keeps_its_images_own_environment(svc: Service, image: str, tmp_path: Path) -> None:
    # The service's PATH, LANG and SHELL replaced the image's: a tool on the image's PATH was
    # "not found in $PATH".
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "mytool").write_text(
        '#!/bin/sh\necho "tool: PATH=$PATH LANG=$LANG SHELL=$SHELL MINE=$MINE"\n'
    )
    (ctx / "mytool").chmod(0o755)
    (ctx / "Containerfile").write_text(
        f"FROM {image}\nENV PATH=/opt/tool/bin:/bin LANG=xx_XX.UTF-8\nCOPY mytool /opt/tool/bin/\n"
    )
    name = f"localhost/aisched-test-env:{svc.port}"
    subprocess.run(["podman", "build", "-q", "-t", name, str(ctx)], check=True, capture_output=True)
    try:
        jid = svc.run("--image", name, "--env", "MINE=kept", "--", "mytool")
        svc.wait_state(jid, "succeeded")
        assert logs(svc, jid) == "tool: PATH=/opt/tool/bin:/bin LANG=xx_XX.UTF-8 SHELL= MINE=kept\n"
    finally:
        subprocess.run(["podman", "rmi", "-f", name], capture_output=True, check=False)


def test_the_startup_lines_and_nodes_say_what_runs_containers(svc: Service, image: str) -> None:
    log = svc.log.read_text()
    assert "container engine: podman" in log
    assert "OCI runtime" in log
    (node,) = svc.cli_json("nodes")["nodes"]
    engine = [n for n in node["notes"] if n.startswith("container engine: podman")]
    assert len(engine) == 1  # once: the start-up lines and the executor both say it
    assert len(set(node["notes"])) == len(node["notes"])


def test_a_64M_task_is_oom_killed_and_reported_as_out_of_memory(svc: Service, image: str) -> None:
    jid = svc.run(
        "--image", image, "--mem", "64M", "--restart", "never", "--",
        "python3", "-c", "x = bytearray(512 << 20); print('still alive')",
    )  # fmt: skip
    job = svc.wait_state(jid, "failed")
    assert job["message"] == (
        "task main-0 killed: exceeded its memory limit of 64 MiB; restart policy is never"
    )
    assert logs(svc, jid) == "aisched: killed: exceeded its memory limit of 64 MiB\n"


def test_a_kill_9_that_is_not_the_oom_killers_is_not_reported_as_out_of_memory(
    svc: Service, image: str
) -> None:
    # Under cgroup v1 the removal of the container's cgroup signals its OOM eventfd too: each
    # exit 137 (a SIGKILL from outside, or `exit 137`) was "exceeded its memory limit".
    jid = svc.run(
        "--image", image, "--mem", "256M", "--restart", "never", "--", "sh", "-c", "exit 137"
    )  # fmt: skip
    job = svc.wait_state(jid, "failed")
    assert job["message"] == (
        "task main-0 killed by signal 9 (SIGKILL); restart policy is never"
    ), job["message"]
    assert [(t["exit_kind"], t["exit_code"]) for t in job["tasks"]] != [("oom", -9)]


PROBE = r"""
import os
def read(*paths):
    for p in paths:
        try:
            return open(p).read().strip()
        except OSError:
            pass
    return "?"
v1 = os.path.isdir("/sys/fs/cgroup/cpu")
cpu = "/sys/fs/cgroup/cpu/"
quota = (read(cpu + "cpu.cfs_quota_us") + "/" + read(cpu + "cpu.cfs_period_us")
         if v1 else read("/sys/fs/cgroup/cpu.max").replace(" ", "/"))
pids = read("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")
print("cpu", quota, "pids", pids, "affinity", len(os.sched_getaffinity(0)))
# Past the pids limit, fork fails: count how many children could be started.
kids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            import time
            time.sleep(5)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print("fork refused after", len(kids) // 10 * 10 if len(kids) < 64 else len(kids), e.strerror)
for k in kids:
    os.kill(k, 9)
"""


def test_cpu_and_pids_limits_are_applied(svc: Service, image: str) -> None:
    jid = svc.run("--image", image, "--cpus", "0.5", "--", "python3", "-c", PROBE)
    svc.wait_state(jid, "succeeded", timeout_s=60)
    out = logs(svc, jid).splitlines()
    # 0.5 CPU: 50 ms of every 100 ms; pinned to one core; 64 processes (the service's
    # container_pids_limit), so the 200 forks stop short of it.
    assert out[0] == "cpu 50000/100000 pids 64 affinity 1"
    assert out[1].startswith("fork refused after 60 ")


def test_cpu_quota_holds_a_busy_loop_to_half_a_core(svc: Service, image: str) -> None:
    busy = (
        "import os, time\n"
        "t0, c0 = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - t0 < 3: pass\n"
        "print(round((time.process_time() - c0) / (time.monotonic() - t0), 2))\n"
    )
    jid = svc.run("--image", image, "--cpus", "0.5", "--", "python3", "-c", busy)
    svc.wait_state(jid, "succeeded", timeout_s=60)
    share = float(logs(svc, jid))
    # The CFS quota allows 0.5; a loaded machine only gives less.
    assert 0.0 < share <= 0.6


GANG = r"""
import os, socket, time
rank, addr = int(os.environ["RANK"]), os.environ["MASTER_ADDR"]
port = int(os.environ["MASTER_PORT"])
if rank == 0:
    s = socket.create_server(("0.0.0.0", port))
    conn, _ = s.accept()
    print("master got:", conn.recv(100).decode())
else:
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    c.sendall(b"hello from rank 1 of " + os.environ["WORLD_SIZE"].encode())
    print("worker connected to the master at", "gateway" if addr != "127.0.0.1" else addr)
"""


def test_a_gang_of_two_bridged_containers_reaches_its_master(
    svc: Service, image: str, tmp_path: Path
) -> None:
    (svc.work / "gang.py").write_text(GANG)
    job = (
        f"name: gang\nimage: {image}\nnetwork: bridge\nreplicas: 2\n"
        f"command: [python3, {svc.work}/gang.py]\nresources: {{cpus: 1, mem: 256M}}\n"
    )
    (svc.work / "gang.yaml").write_text(job)
    jid = str(svc.cli_json("submit", "gang.yaml")["id"])
    svc.wait_state(jid, "succeeded", timeout_s=60)
    assert svc.cli("logs", jid, "--task", "main-0").stdout == (
        "master got: hello from rank 1 of 2\n"
    )
    assert svc.cli("logs", jid, "--task", "main-1").stdout == (
        "worker connected to the master at gateway\n"
    )


SENDER = r"""
import os, socket
c = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["RECEIVER_PORT"])))
c.sendall(b"x" * int(os.environ["BYTES"]))
c.shutdown(socket.SHUT_WR)
print("receiver counted", c.recv(64).decode())
"""


class Receiver:
    """A TCP receiver on the host: the rate is measured from its first byte to its last."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]
        self.rate_bit_s = 0.0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.sock.accept()
        got, first = 0, 0.0
        while chunk := conn.recv(1 << 16):
            if not got:
                first = time.monotonic()
            got += len(chunk)
        self.rate_bit_s = got * 8 / max(time.monotonic() - first, 1e-6)
        conn.sendall(str(got).encode())
        conn.close()


def test_a_10Mbit_task_sends_no_faster_than_10Mbit_and_an_unlimited_one_is_faster(
    svc: Service, image: str
) -> None:
    (svc.work / "send.py").write_text(SENDER)
    size = 4_000_000  # 3.2 s at 10 Mbit/s
    rates = {}
    for label, extra in (("shaped", ["--bandwidth", "10Mbit"]), ("free", ["--network", "bridge"])):
        r = Receiver()
        jid = svc.run(
            "--image", image, *extra, "--env", f"RECEIVER_PORT={r.port}",
            "--env", f"BYTES={size}", "--", "python3", f"{svc.work}/send.py",
        )  # fmt: skip
        svc.wait_state(jid, "succeeded", timeout_s=60)
        r.thread.join(10)
        assert logs(svc, jid).endswith(f"receiver counted {size}\n")
        rates[label] = r.rate_bit_s
    assert 5e6 < rates["shaped"] <= 10e6 * 1.1
    assert rates["free"] > 3 * rates["shaped"]


@pytest.mark.parametrize(
    ("rate", "bit_s"),
    [
        # 10 ms of it as the burst was 12.5 GB, which tc refused (a 32-bit size): every
        # launch failed, and was retried.
        ("10Tbit", 10**13),
        # 50 ms of it as the queue, worked out by tc from `latency 50ms`, wrapped to 5 bytes.
        ("572662307kbit", 572_662_307_000),
    ],
)
def test_the_largest_rates_are_shaped_with_a_burst_and_queue_tc_takes(
    svc: Service, image: str, rate: str, bit_s: int
) -> None:
    jid = svc.run("--image", image, "--bandwidth", rate, "--grace-period", "1s", "--",
                  "sh", "-c", "echo up; sleep 60")  # fmt: skip
    svc.wait_state(jid, "running")
    wait_for("the task to start", lambda: logs(svc, jid).endswith("up\n"))
    (name,) = containers_of_job(svc, jid)
    pid = subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", name],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    shown = subprocess.run(["nsenter", "-t", pid, "-n", "tc", "-j", "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    [qdisc] = json.loads(shown)
    options = qdisc["options"]
    # As tc shows them: the rate in bytes per second; the burst as the kernel keeps it (in
    # time at the rate: read back a little short); `lat`, the time the queue holds beyond
    # the burst (in µs), where that is positive, else the queue's `limit` in bytes (5 when
    # it had wrapped).
    assert (qdisc["kind"], options["rate"]) == ("tbf", bit_s // 8)
    burst = min(bit_s // 800, 2**31 - 1)
    assert 0.99 * burst <= options["burst"] <= burst
    assert "limit" not in options and options["lat"] > 1000, options
    assert logs(svc, jid) == f"aisched: egress shaped to {bit_s} bit/s (tc tbf on eth0)\nup\n"
    svc.cli("cancel", jid)
    svc.wait_state(jid, "cancelled")
    assert containers_of_job(svc, jid) == []


VOLCANO = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: vc-image
spec:
  minAvailable: 1
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: main
              image: {image}
              command: [sh, -c]
              args: ["echo $GREETING from $(cat {marker}) in $(pwd) > /out/result.txt"]
              workingDir: /tmp
              env: [{{name: GREETING, value: hello}}]
              volumeMounts: [{{name: out, mountPath: /out}}]
              resources: {{limits: {{cpu: "1", memory: 256Mi}}}}
          volumes:
            - name: out
              hostPath: {{path: {out}, type: Directory}}
"""


def test_a_volcano_job_with_an_image_runs_unchanged(
    svc: Service, image: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (svc.work / "vc.yaml").write_text(VOLCANO.format(image=image, marker=MARKER, out=out))
    submitted = svc.cli_json("submit", "vc.yaml")
    assert submitted.get("warnings", []) == []
    jid = str(submitted["id"])
    svc.wait_state(jid, "succeeded", timeout_s=60)
    assert (out / "result.txt").read_text() == f"hello from {MARKER_TEXT.strip()} in /tmp\n"


def test_kill_9_of_the_service_adopts_running_containers_and_runs_nothing_twice(
    tmp_path: Path, image: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with local_service(tmp_path) as svc:
        job = (
            f"name: survivor\nimage: {image}\nrestart: {{policy: never}}\n"
            f"volumes: [{{host_path: {data}, path: /data}}]\n"
            "command: 'echo start >> /data/runs; sleep 6; echo done >> /data/runs'\n"
        )
        (svc.work / "survivor.yaml").write_text(job)
        jid = str(svc.cli_json("submit", "survivor.yaml")["id"])
        svc.wait_state(jid, "running")
        wait_for("the task to start", lambda: (data / "runs").exists())
        svc.kill9()
        names = containers_of_job(svc, jid)
        assert len(names) == 1
        state = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Status}}", names[0]],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert state == "running"  # the container outlives its scheduler
        svc.start()
        svc.wait_state(jid, "succeeded", timeout_s=60)
        # Ran once, to its end, in the container that was adopted; and removed after.
        assert (data / "runs").read_text() == "start\ndone\n"
        assert containers_of_job(svc, jid) == []


def test_a_missing_image_fails_at_once_with_the_images_name(svc: Service, image: str) -> None:
    job = _failed_once_for_its_image(svc, "localhost/aisched-no-such-image:1")
    assert job["message"].startswith(
        "task main-0 image localhost/aisched-no-such-image:1: not present on this node and "
        "could not be pulled ("
    )
    assert logs(svc, job["id"]).startswith(
        "aisched: image localhost/aisched-no-such-image:1 is not on this node: pulling it\n"
        "aisched: image localhost/aisched-no-such-image:1: not present"
    )
    assert [(t["exit_kind"], t["exit_code"]) for t in job["tasks"]] == [("unrunnable", 125)]


def test_a_missing_image_that_the_pull_policy_keeps_from_pulling_says_so(
    tmp_path: Path, image: str
) -> None:
    # "pulling it (if the pull policy allows)" and "could not be pulled" hid that it was not
    # even tried.
    with local_service(tmp_path, "image_pull: never\n") as svc:
        job = _failed_once_for_its_image(svc, "localhost/aisched-no-such-image:1")
        assert job["message"].startswith(
            "task main-0 image localhost/aisched-no-such-image:1: not present on this node, "
            "and image_pull: never forbids a pull ("
        )
        assert logs(svc, job["id"]).startswith(
            "aisched: image localhost/aisched-no-such-image:1 is not on this node, and "
            "image_pull: never forbids a pull\n"
        )


def test_a_short_name_no_registry_resolves_fails_at_once_as_a_missing_image(
    svc: Service, image: str, tmp_path: Path
) -> None:
    """podman refuses a short name that its registries.conf maps to no registry. Before, that
    was 'could not be created', a failure retried up to the job's retries, each attempt
    taking its GPUs again. The registries.conf the service names (CONTAINERS_REGISTRIES_CONF,
    passed on to the engine) searches no registry, whatever the machine's says."""
    conf = tmp_path / "registries.conf"
    conf.write_text('unqualified-search-registries = []\nshort-name-mode = "enforcing"\n')
    svc.stop()
    svc.extra_env["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    svc.start()
    job = _failed_once_for_its_image(svc, "aisched-no-such-image:1")
    assert job["message"].startswith(
        "task main-0 image aisched-no-such-image:1: not present on this node and could not be "
        'pulled (short-name "aisched-no-such-image:1" did not resolve to an alias and no '
        f'unqualified-search registries are defined in "{conf}"'  # the service's, not the machine's
    )


def _failed_once_for_its_image(svc: Service, image: str) -> dict[str, Any]:
    """The job of `true` in `image`, failed at its first attempt and not retried: the default
    restart policy retries failures, and a missing image is not one."""
    job = svc.wait_state(svc.run("--image", image, "--", "true"), "failed", timeout_s=60)
    assert (job["attempt"], job["failures"]) == (1, 1)
    assert job["message"].endswith("); not retried")
    return job


def test_shm_size_sets_the_containers_dev_shm(svc: Service, image: str) -> None:
    jid = svc.run("--image", image, "--shm-size", "128M", "--", "sh", "-c", "df -m /dev/shm")
    svc.wait_state(jid, "succeeded")
    assert logs(svc, jid).splitlines()[1].split()[1] == "128"  # df's size column, in MiB


SETUID_PROBE = r"""
import os
print("euid", os.geteuid())
try:
    open("/host/etc/shadow").read()
    print("read the host's /etc/shadow")
except PermissionError:
    print("host /etc/shadow: permission denied")
"""


def test_a_variable_with_a_line_break_is_refused_and_one_line_reaches_the_task(
    svc: Service, image: str
) -> None:
    # An env file holds one line a variable; the command line of the engine is readable by
    # every local user, and its own environment is root's: such a value has nowhere to go.
    refused = svc.cli(
        "run", "--image", image, "--env", "NOTE=two\nlines", "--", "true", check=False
    )
    assert refused.returncode != 0
    assert "--env NOTE: a container task's variable cannot hold a line break" in refused.stderr
    jid = svc.run("--image", image, "--env", "PLAIN=one line", "--", "sh", "-c", 'echo "[$PLAIN]"')
    svc.wait_state(jid, "succeeded")
    assert logs(svc, jid) == "[one line]\n"


def test_a_setuid_root_binary_in_the_image_does_not_gain_root(image: str, tmp_path: Path) -> None:
    """The image holds a setuid-root Python; the host's / is mounted (a hostPath any job
    may name). Run as a user, with the hardening every container gets, it stays that user;
    the same container without the hardening would be root (checked, so the probe is real)."""
    engine = detect_engine()
    env_file = tmp_path / "env"
    env_file.write_text("PATH=/usr/bin:/bin\n")
    t = ContainerTask(
        instance="setuid-test", job_id=f"s{os.getpid()}", attempt=1, task="main-0",
        command=("suid-python3", "-c", SETUID_PROBE), env={}, workdir=None, cores=(),
        milli_cpu=0, mem_limit_mib=0, gpus=(), checkpoint_dir=None, env_file=str(env_file),
        user={"name": "nobody", "uid": 65534, "gid": 65534, "groups": [], "home": "/"},
    )  # fmt: skip
    spec = ContainerSpec(image, network=NetworkMode.NONE, volumes=(Volume("/", "/host", True),))
    hardened = create_args(spec, t, engine)
    bare = [a for a in hardened if a not in ("--cap-drop", "all", "--security-opt",
                                              "no-new-privileges")]  # fmt: skip
    bare[bare.index("--name") + 1] += "-bare"
    outputs = []
    for argv in (hardened, bare):
        name = argv[argv.index("--name") + 1]
        try:
            subprocess.run(argv, check=True, capture_output=True)
            r = subprocess.run(start_args(engine, name), capture_output=True, text=True)
            outputs.append(r.stdout)
        finally:
            remove_container(engine.binary, name)
    assert outputs == [
        "euid 65534\nhost /etc/shadow: permission denied\n",
        "euid 0\nread the host's /etc/shadow\n",
    ]


def test_a_job_may_not_mount_a_host_path_its_user_cannot_read(image: str, tmp_path: Path) -> None:
    from aisched.executors.base import LaunchError, TaskLaunch
    from aisched.executors.local import LocalExecutor

    secret = Path(tempfile.mkdtemp())  # 0700, root's
    spec = ContainerSpec(image, volumes=(Volume(str(secret), "/secret"),))
    ex = LocalExecutor(tmp_path / "state", fork_server=False)
    try:
        with pytest.raises(LaunchError) as err:
            ex.launch(
                TaskLaunch(
                    job_id="9", attempt=1, task="main-0", node=ex.nodes()[0].name,
                    command=("true",), env={}, workdir=None, milli_cpu=0, mem_limit_mib=0,
                    gpus=(), log_path=str(tmp_path / "log"), grace_period_s=1.0,
                    user="nobody", container=spec,
                )
            )  # fmt: skip
        assert str(err.value) == (
            f"task 9/1/main-0: volumes.0: user nobody may not read {secret}, "
            "so its job may not mount it"
        )
        # Its working directory is mounted too, read-write: the same rule holds at launch
        # for a job admitted before admission checked it.
        with pytest.raises(LaunchError) as err:
            ex.launch(
                TaskLaunch(
                    job_id="9", attempt=2, task="main-0", node=ex.nodes()[0].name,
                    command=("true",), env={}, workdir=str(secret), milli_cpu=0,
                    mem_limit_mib=0, gpus=(), log_path=str(tmp_path / "log"),
                    grace_period_s=1.0, user="nobody", container=ContainerSpec(image),
                )
            )  # fmt: skip
        assert str(err.value) == (
            f"task 9/2/main-0: workdir: user nobody may not read {secret}, so its container "
            "may not mount it"
        )
    finally:
        ex.close()
        secret.rmdir()


GRACEFUL = r"""
import signal, sys, time
def bye(signum, frame):
    print("got SIGTERM, checkpointing", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("running", flush=True)
time.sleep(120)
"""


def test_cancel_stops_a_container_with_sigterm_then_kills_it_after_the_grace(
    svc: Service, image: str
) -> None:
    (svc.work / "graceful.py").write_text(GRACEFUL)
    polite = svc.run("--image", image, "--grace-period", "20s", "--",
                     "python3", f"{svc.work}/graceful.py")  # fmt: skip
    # A shell as PID 1 ignores SIGTERM, as in a pod: it is killed when the grace is over.
    stubborn = svc.run("--image", image, "--grace-period", "1s", "--",
                       "sh", "-c", "echo running; sleep 120")  # fmt: skip
    for jid in (polite, stubborn):
        svc.wait_state(jid, "running")
        wait_for("the task to start", lambda jid=jid: logs(svc, jid).startswith("running"))
    svc.cli("cancel", polite, stubborn)
    assert svc.wait_state(polite, "cancelled")["message"] == "cancelled"
    assert svc.wait_state(stubborn, "cancelled")["message"] == "cancelled"
    assert logs(svc, polite) == (
        "running\naisched: stop requested: SIGTERM, then SIGKILL after 20 s\n"
        "got SIGTERM, checkpointing\n"
    )
    assert (
        logs(svc, stubborn) == "running\naisched: stop requested: SIGTERM, then SIGKILL after 1 s\n"
    )
    tasks = {j: svc.job(j)["tasks"][0] for j in (polite, stubborn)}
    assert [(t["exit_kind"], t["exit_code"]) for t in tasks.values()] == [
        ("stopped", 0),
        ("stopped", -9),
    ]
    assert containers_of_job(svc, polite) == containers_of_job(svc, stubborn) == []


def ray_task_spec(
    image: str, tmp_path: Path, name: str, command: list[str], mem: int = 0
) -> dict[str, Any]:
    return {
        "command": command,
        "env": {"PATH": "/usr/bin:/bin", "RANK": "0"},
        "workdir": None,
        "log_path": str(tmp_path / f"{name}.log"),
        "grace_period_s": 1.0,
        "key": ["r1", 1, f"{name}-0"],
        "gpus": [],
        "gpu_mem_mib": 0,
        "gpu_check_s": 5.0,
        "container": {
            "image": image, "network": "host", "bandwidth_bit_s": None, "shm_mib": None,
            "volumes": [], "instance": f"raytest{os.getpid()}", "milli_cpu": 1000,
            "mem_limit_mib": mem,
        },
    }  # fmt: skip


def test_a_ray_tasks_container_runs_on_its_node_as_on_one_machine(
    image: str, tmp_path: Path
) -> None:
    """The Ray task runner (what runs in a task's actor on its node) drives the same
    container as the local supervisor: the image's files, the exit code, OOM, removal."""
    from aisched.executors.ray_task import TaskRunner

    ok = TaskRunner(ray_task_spec(image, tmp_path, "ok", ["sh", "-c", f"cat {MARKER}; exit 4"]))
    oom = TaskRunner(
        ray_task_spec(image, tmp_path, "oom", ["python3", "-c", "bytearray(512 << 20)"], 64)
    )
    missing = TaskRunner(
        {**ray_task_spec(image, tmp_path, "missing", ["true"]),
         "container": {**ray_task_spec(image, tmp_path, "missing", ["true"])["container"],
                       "image": "localhost/aisched-no-such-image:1"}}
    )  # fmt: skip
    results = []
    for r in (ok, oom, missing):
        r.start()
        res = r.wait()
        results.append((res["kind"], res["exit_code"], res["message"].split(" (")[0]))
    assert results == [
        ("exited", 4, "exited with code 4"),
        ("oom", -9, "killed: exceeded its memory limit of 64 MiB"),
        ("unrunnable", 125, "image localhost/aisched-no-such-image:1: not present on this node and "
                        "could not be pulled"),
    ]  # fmt: skip
    assert (tmp_path / "ok.log").read_text() == MARKER_TEXT
    left = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label=io.aisched.instance=raytest{os.getpid()}",
         "--format", "{{.Names}}"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert left == ""


def test_a_ray_tasks_container_mounts_only_what_its_user_may_read(
    image: str, tmp_path: Path
) -> None:
    """On a Ray node as on one machine: the engine mounts with its own privileges, so the task
    of a user who may not read a host path fails to start, naming the volume, and no
    container is made."""
    from aisched.executors.ray_task import TaskRunner

    secret = Path(tempfile.mkdtemp())  # root's, 0700
    try:
        spec = ray_task_spec(image, tmp_path, "secret", ["ls", "/s"])
        spec["user"] = "nobody"
        spec["container"]["volumes"] = [[str(secret), "/s", True]]
        runner = TaskRunner(spec)
        runner.start()
        res = runner.wait()
    finally:
        secret.rmdir()
    assert (res["kind"], res["exit_code"], res["message"]) == (
        "exited",
        126,
        f"task r1/1/secret-0: volumes.0: user nobody may not read {secret}, "
        "so its job may not mount it",
    )
    left = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label=io.aisched.instance=raytest{os.getpid()}",
         "--format", "{{.Names}}"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert left == ""


def test_a_container_whose_supervisor_is_killed_is_reported_lost_and_removed(
    image: str, tmp_path: Path
) -> None:
    import signal

    from aisched.executors.base import ExitKind, TaskLaunch
    from aisched.executors.local import LocalExecutor

    ex = LocalExecutor(tmp_path / "state", fork_server=False)
    try:
        handle = ex.launch(
            TaskLaunch(
                job_id="5", attempt=1, task="main-0", node=ex.nodes()[0].name,
                command=("sleep", "60"), env={"PATH": "/bin"}, workdir=None, milli_cpu=500,
                mem_limit_mib=64, gpus=(), log_path=str(tmp_path / "log"), grace_period_s=1.0,
                container=ContainerSpec(image),
            )
        )  # fmt: skip
        name = ex.container_name(("5", 1, "main-0"))

        def running() -> bool:
            out = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", name],
                                 capture_output=True, text=True).stdout  # fmt: skip
            return out.strip() == "running"

        wait_for("the container to run", running)
        os.kill(handle.data["supervisor_pid"], signal.SIGKILL)
        events = wait_for("the task's end", ex.poll)
        assert [(e.kind, e.exit_code) for e in events] == [(ExitKind.LOST, None)]
        gone = subprocess.run(["podman", "container", "exists", name], check=False)
        assert gone.returncode == 1
    finally:
        ex.close()


def _attach_client_pid(svc: Service, jid: str, name: str) -> int:
    """The pid of the task's `podman start --attach`: the supervisor's child."""
    record = svc.home / "tasks" / jid / "1" / "main-0" / "started.json"
    wait_for("its supervisor's record", record.exists)
    return int(json.loads(record.read_text())["child_pid"])


def _conmon_pid(svc: Service, jid: str, name: str) -> int:
    out = subprocess.run(["podman", "inspect", "--format", "{{.State.ConmonPid}}", name],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return int(out)


@pytest.mark.parametrize(
    ("victim", "pid_of", "client_ended"),
    [
        ("attach client", _attach_client_pid, "killed by signal 9 (SIGKILL)"),
        # Without conmon the client cannot read the exit code and gives up.
        ("conmon", _conmon_pid, "exited with code 127"),
    ],
)
def test_a_container_that_outlives_its_attached_client_is_killed_and_never_succeeds(
    svc: Service, image: str, victim: str, pid_of: Any, client_ended: str
) -> None:
    import signal

    # A running container's ExitCode is 0: read without its state, the task had succeeded
    # at the client's death, with the container removed while it ran.
    jid = svc.run("--image", image, "--restart", "never", "--",
                  "sh", "-c", "echo start; sleep 60; echo finished")  # fmt: skip
    svc.wait_state(jid, "running")
    wait_for("the task to start", lambda: logs(svc, jid) == "start\n")
    (name,) = containers_of_job(svc, jid)
    os.kill(pid_of(svc, jid, name), signal.SIGKILL)
    done = svc.wait_state(jid, "failed", "succeeded", timeout_s=60)
    binary = shutil.which("podman")
    why = (
        f"its container's attached client (`{binary} start --attach`) {client_ended} while the "
        "container was still running: nothing could follow its output and exit any more, so "
        "the container was killed"
    )
    assert (done["state"], done["message"]) == (
        "failed",
        f"task main-0 {why}; restart policy is never",
    ), victim
    assert [(t["exit_kind"], t["exit_code"]) for t in done["tasks"]] == [("lost", None)]
    lines = logs(svc, jid).splitlines()
    # Between them, what the client said as it gave up (without conmon: that it could not
    # read the exit code, as the container was running).
    assert (lines[0], lines[-1]) == ("start", f"aisched: {why}")
    assert [ln for ln in lines[1:-1] if "no such exit code" not in ln] == []
    assert containers_of_job(svc, jid) == []


def test_a_restart_removes_a_container_whose_supervisor_died_with_the_scheduler(
    tmp_path: Path, image: str
) -> None:
    import signal

    with local_service(tmp_path) as svc:
        jid = svc.run("--image", image, "--restart", "never", "--", "sleep", "60")
        svc.wait_state(jid, "running")
        names = wait_for("its container", lambda: containers_of_job(svc, jid))
        # The container is listed from `create` on; the supervisor records itself once it has
        # started it, and that record is what this test kills by.
        record = svc.home / "tasks" / jid / "1" / "main-0" / "started.json"
        wait_for("its supervisor's record", record.exists)
        svc.kill9()
        # Its supervisor dies too (a crash, an OOM of the host...): the container runs on,
        # looked after by nobody.
        started = json.loads(record.read_text())
        os.kill(started["supervisor_pid"], signal.SIGKILL)
        assert containers_of_job(svc, jid) == names
        svc.start()
        done = svc.wait_state(jid, "failed", timeout_s=60)
        assert done["message"] == (
            "task main-0 its supervisor is gone without a record; what was left of it was "
            "killed; restart policy is never"
        )
        assert containers_of_job(svc, jid) == []


def test_an_engine_that_failed_its_first_probe_is_probed_again_and_runs_the_job(
    tmp_path: Path, image: str
) -> None:
    """The engine fails the service's start-up probe (its storage is busy: a passing fault, put
    in front of the real podman by a wrapper found first on the service's PATH) and works a
    moment later. A container job then fails its first launch, which probes the engine again in
    the background, and its retry runs in the image: no restart of the service is needed."""
    from aisched.executors.engine_probe import REPROBE_AFTER_S

    real = shutil.which("podman")
    assert real is not None
    busy, wrapper = tmp_path / "storage-busy", tmp_path / "bin" / "podman"
    busy.touch()
    wrapper.parent.mkdir()
    wrapper.write_text(
        f"#!/bin/sh\nif [ -e {busy} ]; then\n"
        "  echo 'Error: database is locked: storage is being migrated' >&2; exit 125\nfi\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (home / "config.yaml").write_text("container_runtime: podman\n")
    svc = Service(home, free_port(), work, ["--cpus", "2", "--mem", "4G", "--config",
                                           str(home / "config.yaml")])  # fmt: skip
    svc.extra_env = {"PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
    probed_at = time.monotonic()
    svc.start()
    try:
        assert (
            "container tasks cannot run: podman does not work here: Error: database is locked: "
            "storage is being migrated"
        ) in svc.log.read_text()
        busy.unlink()  # the migration is over
        time.sleep(max(0.0, probed_at + REPROBE_AFTER_S - time.monotonic()))
        (work / "job.yaml").write_text(
            f"image: {image}\ncommand: [sh, -c, 'cat {MARKER}']\n"
            "restart: {policy: on-failure, max_retries: 5, backoff: 1s}\n"
        )
        jid = str(svc.cli_json("submit", "job.yaml")["id"])
        job = svc.wait_state(jid, "succeeded", "failed", timeout_s=90)
        events = [e["message"] for e in job["events"]]
        assert job["state"] == "succeeded", events
        assert logs(svc, jid).endswith(MARKER_TEXT)
        assert any("(the engine is being probed again)" in m for m in events), events
        found = "container engine found on a new probe: container engine: podman"
        assert found in svc.log.read_text()
    finally:
        cancel_all(svc)
        svc.stop()


VOLCANO_WORKDIRS = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: vc-workdirs
spec:
  tasks:
    - name: etc
      template:
        spec:
          restartPolicy: Never
          containers:
            - image: {image}
              command: [sh, -c, "echo $(pwd) $(cat aisched-test-image) > /out/etc.txt"]
              workingDir: /etc
              volumeMounts: [{{name: out, mountPath: /out}}]
          volumes: [{{name: out, hostPath: {{path: {out}}}}}]
    - name: none
      template:
        spec:
          restartPolicy: Never
          containers:
            - image: {image}
              command: [sh, -c, "pwd > /out/none.txt"]
              volumeMounts: [{{name: out, mountPath: /out}}]
          volumes: [{{name: out, hostPath: {{path: {out}}}}}]
"""


def test_a_volcano_containers_working_dir_is_the_images_not_the_hosts(
    svc: Service, image: str, tmp_path: Path
) -> None:
    """A Volcano task's workingDir that existed on the host (/etc) had the host's directory
    mounted over the image's; one with none ran in the submitter's directory, mounted, instead
    of the image's WORKDIR. A native job keeps its documented behaviour (below)."""
    out = tmp_path / "out"
    out.mkdir()
    (svc.work / "vc.yaml").write_text(VOLCANO_WORKDIRS.format(image=image, out=out))
    jid = str(svc.cli_json("submit", "vc.yaml")["id"])
    svc.wait_state(jid, "succeeded", timeout_s=60)
    image_workdir = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Config.WorkingDir}}", image],
        capture_output=True, text=True, check=True,
    ).stdout.strip() or "/"  # fmt: skip
    assert (out / "etc.txt").read_text() == f"/etc {MARKER_TEXT.strip()}\n"
    assert (out / "none.txt").read_text() == f"{image_workdir}\n"
    assert image_workdir != str(svc.work)
    native = (
        f"name: here\nimage: {image}\nrestart: {{policy: never}}\n"
        f"volumes: [{{host_path: {out}, path: /out}}]\ncommand: 'pwd > /out/native.txt'\n"
    )
    (svc.work / "native.yaml").write_text(native)
    jid = str(svc.cli_json("submit", "native.yaml")["id"])
    svc.wait_state(jid, "succeeded", timeout_s=60)
    assert (out / "native.txt").read_text() == f"{svc.work}\n"  # where it was submitted
