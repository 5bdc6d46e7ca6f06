"""The device check of GPU sharing and the GPU-memory watchdog, on a machine with NVIDIA GPUs.

Run through `scripts/gpu_check.sh` (which makes the virtual environment). Each phase starts a
real `aisched up` (GPUs found through NVML), submits jobs whose processes really allocate GPU
memory, and checks what they saw and what the watchdog said:

1. local, `gpu_memory_over: report`: two jobs of `gpus: 0.5` share one GPU (the same
   CUDA_VISIBLE_DEVICES, both processes on that GPU in NVML); the one above its declared
   `gpu_mem` gets the watchdog's warning in its log, the other none.
2. local: two whole-GPU jobs land on different GPUs (with one GPU: the second waits); then
   the GPU walls: a 1-GPU job opens only its GPU's device file and CUDA sees only that GPU
   (by PCI bus id), with CUDA_VISIBLE_DEVICES as given and unset; a job without GPUs sees
   none.
3. local, `gpu_memory_over: stop`: the task above its `gpu_mem` is stopped with the reason in
   its log (its job fails, restart policy `never`); its neighbour on the GPU keeps running.
4. Ray (only where Ray is installed): a one-node Ray cluster on this machine and
   `aisched up --ray`, `stop` as in 3: the watchdog runs in the task's actor on the node.

Everything goes under OUTDIR (argument 1): the services' logs, the tasks' logs, NVML's view
(`nvidia-smi`) while the shared pair runs, and `summary.txt` (one PASS/FAIL/SKIP line per
check). Exit status 0 when no check failed. The whole run stays under about four minutes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

PY = sys.executable
DEADLINE = time.monotonic() + float(os.environ.get("GPU_CHECK_BUDGET_S", "270"))

# Allocates FIRST MiB of GPU memory on its first visible GPU (torch, else cupy, else the CUDA
# driver API through ctypes) and says so in one JSON line; once the file GO exists, allocates
# MORE MiB and says so again ("MORE ..."); holds it all for HOLD_S seconds. The two steps let
# the check see both tasks of a pair on their GPU before one of them goes over its limit.
HOLDER = r"""
import ctypes, json, os, sys, time
first, more, hold_s, go = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

def with_torch():
    import torch
    def alloc(mib):
        x = torch.ones(mib << 20, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        return x
    return alloc

def with_cupy():
    import cupy
    def alloc(mib):
        x = cupy.ones(mib << 20, dtype=cupy.uint8)
        cupy.cuda.runtime.deviceSynchronize()
        return x
    return alloc

def with_driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    def ok(code, what):
        if code != 0:
            raise RuntimeError(f"{what} failed with CUDA error {code}")
    ok(cuda.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
    def alloc(mib):
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t(mib << 20)
        ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), size), "cuMemAlloc")
        ok(cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(1), size), "cuMemsetD8")
        return ptr
    return alloc

order = os.environ.get("GPU_ALLOC", "torch,cupy,driver").split(",")
makers = {"torch": with_torch, "cupy": with_cupy, "driver": with_driver}
held, via, errors = [], None, []
for name in order:
    try:
        alloc = makers[name]()
        held.append(alloc(first))
        via = name
        break
    except Exception as e:
        errors.append(f"{name}: {type(e).__name__}: {e}")
# Behind GPU walls CUDA counts the task's GPUs from 0; AISCHED_GPUS has the host's numbers.
host = os.environ.get("AISCHED_GPUS", os.environ.get("CUDA_VISIBLE_DEVICES"))
doc = {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "host_gpus": host, "allocated_mib": first if held else 0, "via": via, "errors": errors}
print("HOLDER " + json.dumps(doc), flush=True)
if not held:
    sys.exit(3)
end = time.monotonic() + hold_s
while more and not os.path.exists(go) and time.monotonic() < end:
    time.sleep(0.2)
if more and os.path.exists(go):
    held.append(alloc(more))
    print("MORE " + json.dumps({"allocated_mib": first + more}), flush=True)
time.sleep(max(0.0, end - time.monotonic()))
"""

# GPU walls: which GPU device files the task can open, and what CUDA sees, first with the
# environment the task was given, then (argument `unset`) without CUDA_VISIBLE_DEVICES, as a
# task that wants every GPU of the machine would run. One JSON line, "WALLS MODE {...}".
WALLS_PROBE = r"""
import ctypes, errno, glob, json, os, sys
mode = sys.argv[1]
if mode == "unset":
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
files = {}
for path in sorted(glob.glob("/dev/nvidia[0-9]*")):
    try:
        os.close(os.open(path, os.O_RDWR))
        files[path] = "opens"
    except OSError as e:
        files[path] = errno.errorcode.get(e.errno, str(e.errno))
buses, rc = [], None
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuInit(0)
    count = ctypes.c_int(0)
    if rc == 0:
        cuda.cuDeviceGetCount(ctypes.byref(count))
    for i in range(count.value):
        dev, bus = ctypes.c_int(), ctypes.create_string_buffer(64)
        cuda.cuDeviceGet(ctypes.byref(dev), i)
        cuda.cuDeviceGetPCIBusId(bus, 64, dev)
        buses.append(bus.value.decode())
except OSError as e:
    rc = f"libcuda: {e}"
doc = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "aisched_gpus": os.environ.get("AISCHED_GPUS"), "files": files, "cu_init": rc,
       "cuda_buses": buses}
print(f"WALLS {mode} " + json.dumps(doc), flush=True)
"""


class Check:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.failed = False

    def record(self, status: str, what: str, detail: str = "") -> None:
        line = f"{status:4} {what}" + (f": {detail}" if detail else "")
        print(line, flush=True)
        self.lines.append(line)
        self.failed |= status == "FAIL"
        (self.out / "summary.txt").write_text("\n".join(self.lines) + "\n")

    def expect(self, ok: bool, what: str, detail: str = "") -> bool:
        self.record("PASS" if ok else "FAIL", what, detail)
        return ok


def left_s() -> float:
    return DEADLINE - time.monotonic()


def wait_for(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    end = time.monotonic() + min(timeout_s, max(1.0, left_s()))
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sh(*args: str, timeout_s: float = 30) -> str:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({' '.join(args)}: {e})"
    return p.stdout + p.stderr


class Aisched:
    """One `aisched up` with its own data directory, and its CLI."""

    def __init__(self, out: Path, name: str, config: dict[str, Any], extra: list[str]) -> None:
        self.dir = out.resolve() / name
        self.home = self.dir / "home"
        self.work = self.dir / "work"
        self.work.mkdir(parents=True)
        self.home.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = self.dir / "aisched.json"
        cfg.write_text(json.dumps(config))
        (self.work / "holder.py").write_text(HOLDER)
        (self.work / "walls.py").write_text(WALLS_PROBE)
        self.log = self.dir / "service.log"
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                [PY, "-m", "aisched", "up", "--port", str(self.port), "--data-dir",
                 str(self.home), "--config", str(cfg), *extra],
                stdout=f, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True,
            )  # fmt: skip
        wait_for("aisched up to answer", self.healthy, 90)

    def env(self) -> dict[str, str]:
        return {**os.environ, "AISCHED_SERVER": self.url, "AISCHED_HOME": str(self.home)}

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"aisched up exited:\n{self.log.read_text()[-3000:]}")
        try:
            return bool(httpx.get(f"{self.url}/v1/healthz", timeout=2).json()["ok"])
        except httpx.HTTPError:
            return False

    def cli(self, *args: str, check: bool = True) -> str:
        p = subprocess.run(
            [PY, "-m", "aisched", *args], capture_output=True, text=True, env=self.env(),
            cwd=self.work, timeout=60,
        )  # fmt: skip
        if check and p.returncode != 0:
            raise RuntimeError(f"aisched {' '.join(args)}: {p.stdout}{p.stderr}")
        return p.stdout

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(args[0], "--json", *args[1:]))

    def submit(
        self, name: str, gpus: float, alloc_mib: int, gpu_mem: str | None, more_mib: int = 0
    ) -> str:
        """A job of one task holding `alloc_mib`, and `more_mib` more once `go(name)`."""
        resources: dict[str, Any] = {"cpus": 1, "mem": "4G", "gpus": gpus}
        if gpu_mem:
            resources["gpu_mem"] = gpu_mem
        doc = {
            "name": name,
            "grace_period": "3s",
            "restart": {"policy": "never"},
            "tasks": [
                {
                    "name": "main",
                    "replicas": 1,
                    "command": [
                        PY,
                        str(self.work / "holder.py"),
                        str(alloc_mib),
                        str(more_mib),
                        "150",
                        str(self.work / f"go-{name}"),
                    ],
                    "workdir": str(self.work),
                    "resources": resources,
                }
            ],
        }
        path = self.work / f"{name}.json"
        path.write_text(json.dumps(doc))
        return str(self.cli_json("submit", str(path))["id"])

    def go(self, name: str) -> None:
        (self.work / f"go-{name}").touch()

    def job(self, jid: str) -> dict[str, Any]:
        return self.cli_json("show", jid)  # type: ignore[no-any-return]

    def logs(self, jid: str) -> str:
        return self.cli("logs", jid, check=False)

    def holder(self, jid: str) -> dict[str, Any] | None:
        """The holder's JSON line, once it has allocated."""
        for line in self.logs(jid).splitlines():
            if line.startswith("HOLDER "):
                return json.loads(line[len("HOLDER ") :])  # type: ignore[no-any-return]
        return None

    def gpus_of(self, jid: str) -> list[int]:
        return [g for t in self.job(jid)["tasks"] for g in t["gpus"]]

    def save_logs(self, *jids: str) -> None:
        for jid in jids:
            (self.dir / f"job-{jid}.log").write_text(self.logs(jid))
            (self.dir / f"job-{jid}.json").write_text(json.dumps(self.job(jid), indent=1))

    def cancel_all(self) -> None:
        for j in self.live_jobs():
            self.cli("cancel", j["id"], check=False)
        wait_for("every job to end", lambda: not self.live_jobs(), 60)

    def live_jobs(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/v1/jobs", timeout=10).json()["jobs"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        """Stops the service, after its jobs (tasks outlive their scheduler: a check that
        failed half-way must not leave GPU memory held)."""
        (self.dir / "nodes.txt").write_text(self.cli("nodes", check=False))
        try:
            self.cancel_all()
        except Exception as e:
            print(f"warning: {self.dir.name}: cannot cancel its jobs: {e}", flush=True)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def watchdog_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "MiB of GPU memory" in ln]


def gpu_count() -> int:
    return len([ln for ln in sh("nvidia-smi", "-L").splitlines() if ln.startswith("GPU ")])


def nvml_view(out: Path, name: str) -> str:
    view = sh(
        "nvidia-smi",
        "--query-compute-apps=pid,gpu_bus_id,used_memory",
        "--format=csv",
    )
    (out / f"nvidia-smi-{name}.csv").write_text(view)
    return view


def shared_pair(c: Check, svc: Aisched, label: str, over_word: str) -> tuple[str, str]:
    """Two half-GPU jobs: `within` (1 GiB of the 6G declared), `over` (0.5 GiB, then 4 GiB, of
    2G declared). Checks they share one GPU, then has `over` go above its limit; returns their
    ids."""
    within = svc.submit("within", 0.5, 1024, "6G")
    over = svc.submit("over", 0.5, 512, "2G", more_mib=3584)
    holders = wait_for(
        f"{label}: both shared-GPU jobs to allocate",
        lambda: (lambda a, b: (a, b) if a and b else None)(svc.holder(within), svc.holder(over)),
        120,
    )
    for jid, h in zip((within, over), holders, strict=True):
        c.record("INFO", f"{label}: job {jid}", json.dumps(h))
    host = [h["host_gpus"] for h in holders]
    gpus = [svc.gpus_of(within), svc.gpus_of(over)]
    c.expect(
        host[0] == host[1] and gpus[0] == gpus[1] and host[0] == ",".join(map(str, gpus[0])),
        f"{label}: the two gpus=0.5 jobs share one GPU",
        f"host GPUs {host}, scheduler's GPUs {gpus}",
    )
    c.expect(
        all(h["allocated_mib"] > 0 for h in holders),
        f"{label}: both processes allocated GPU memory",
        ", ".join(f"{h['via']}: {h['allocated_mib']} MiB" for h in holders),
    )
    view = nvml_view(svc.dir, label)
    pids = [str(h["pid"]) for h in holders]
    rows = [ln for ln in view.splitlines() if ln.split(",")[0].strip() in pids]
    buses = {ln.split(",")[1].strip() for ln in rows}
    c.expect(
        len(rows) == 2 and len(buses) == 1,
        f"{label}: NVML sees both processes on one GPU",
        " | ".join(rows) or view.strip(),
    )
    svc.go("over")
    wait_for(f"{label}: the over job's second allocation", lambda: "MORE " in svc.logs(over), 60)
    wait_for(
        f"{label}: the watchdog's {over_word} in the over job's log",
        lambda: f"aisched: {over_word}: the task uses" in svc.logs(over),
        30,
    )
    return within, over


def phase_local_report(c: Check, out: Path) -> None:
    svc = Aisched(out, "local-report", {"gpu_memory_over": "report"}, [])
    try:
        within, over = shared_pair(c, svc, "local report", "warning")
        time.sleep(6)  # another check: still one warning, both still running
        said = watchdog_lines(svc.logs(over))
        c.expect(
            len(said) == 1 and said[0].startswith("aisched: warning: the task uses"),
            "local report: the over job's log has one watchdog warning",
            " | ".join(said),
        )
        c.expect(
            not watchdog_lines(svc.logs(within)),
            "local report: the job within its gpu_mem has none",
        )
        states = [svc.job(j)["state"] for j in (within, over)]
        c.expect(states == ["running", "running"], "local report: both keep running", str(states))
        svc_said = watchdog_lines(svc.log.read_text())
        c.expect(
            bool(svc_said),
            "local report: the scheduler's log has it",
            svc_said[-1] if svc_said else "",
        )
        svc.save_logs(within, over)
        svc.cancel_all()
        phase_whole(c, svc)
        phase_walls(c, svc)
    finally:
        svc.stop()


def phase_whole(c: Check, svc: Aisched) -> None:
    n = gpu_count()
    a = svc.submit("whole-a", 1, 256, None)
    b = svc.submit("whole-b", 1, 256, None)
    if n >= 2:
        ha, hb = wait_for(
            "both whole-GPU jobs to allocate",
            lambda: (lambda x, y: (x, y) if x and y else None)(svc.holder(a), svc.holder(b)),
            120,
        )
        host = [ha["host_gpus"], hb["host_gpus"]]
        c.expect(
            host[0] != host[1] and [svc.gpus_of(a), svc.gpus_of(b)] == [[int(x)] for x in host],
            "local: two whole-GPU jobs land on different GPUs",
            f"host GPUs {host}",
        )
        nvml_view(svc.dir, "whole")
    else:
        ha = wait_for("the whole-GPU job to allocate", lambda: svc.holder(a), 120)
        jb = svc.job(b)
        c.expect(
            jb["state"] == "pending",
            "local: with one GPU, the second whole-GPU job waits",
            f"first got host GPUs {ha['host_gpus']}; second "
            f"{jb['state']}: {jb.get('reason') or jb.get('message') or ''}",
        )
        c.record("SKIP", "local: two whole-GPU jobs on different GPUs", f"{n} GPU on this machine")
    svc.save_logs(a, b)
    svc.cancel_all()


def bus_of(gpu: int) -> str:
    """NVML's PCI bus id of host GPU `gpu`, as CUDA writes it (`0000:17:00.0`)."""
    row = sh("nvidia-smi", "-i", str(gpu), "--query-gpu=pci.bus_id", "--format=csv,noheader")
    return row.strip().lower()[-12:]


def phase_walls(c: Check, svc: Aisched) -> None:
    """GPU walls (docs/security.md, GPUs): a job opens and sees its own GPU only, also with
    CUDA_VISIBLE_DEVICES unset; a job without GPUs sees none."""
    up = [ln.strip() for ln in svc.log.read_text().splitlines() if "GPU walls" in ln]
    c.record("INFO", "walls: start-up line", " | ".join(up) or "(none)")
    if not up or up[0].startswith("GPU walls: none"):
        c.record("SKIP", "walls", "the service put up no GPU walls here (see the line above)")
        return
    probe = f"{PY} walls.py given; env -u CUDA_VISIBLE_DEVICES {PY} walls.py unset"
    ids = {
        n: str(svc.cli_json("run", "--gpus", str(n), "--", "sh", "-c", probe)["id"]) for n in (1, 0)
    }
    for jid in ids.values():
        wait_for(f"walls: job {jid} to end", lambda j=jid: svc.job(j)["state"] == "succeeded", 90)
    seen = {}
    for n, jid in ids.items():
        for ln in svc.logs(jid).splitlines():
            if ln.startswith("WALLS "):
                _, mode, doc = ln.split(" ", 2)
                seen[n, mode] = json.loads(doc)
                c.record("INFO", f"walls: gpus {n}, {mode}", doc)
    svc.save_logs(*ids.values())
    if len(seen) != 4:
        c.record("FAIL", "walls: every probe said what it saw", str(sorted(seen)))
        return
    mine = int(seen[1, "given"]["aisched_gpus"])
    for mode in ("given", "unset"):
        one, none = seen[1, mode], seen[0, mode]
        opened = [f for f, r in one["files"].items() if r == "opens"]
        others = [r for f, r in one["files"].items() if f not in opened]
        c.expect(
            len(opened) == 1 and all(r == "EPERM" for r in others),
            f"walls: a 1-GPU job opens one GPU's file, the others EPERM ({mode})",
            json.dumps(one["files"]),
        )
        c.expect(
            one["cuda_buses"] and [b.lower()[-12:] for b in one["cuda_buses"]] == [bus_of(mine)],
            f"walls: CUDA sees the job's own GPU only, host GPU {mine} ({mode})",
            f"CUDA's buses {one['cuda_buses']}, NVML's for GPU {mine}: {bus_of(mine)}",
        )
        c.expect(
            all(r == "EPERM" for r in none["files"].values()) and not none["cuda_buses"],
            f"walls: a job without GPUs opens none and CUDA sees none ({mode})",
            f"{json.dumps(none['files'])}, cuInit {none['cu_init']}",
        )
    svc.cancel_all()


def phase_stop(c: Check, out: Path, label: str, extra: list[str]) -> None:
    svc = Aisched(out, label.replace(" ", "-"), {"gpu_memory_over": "stop"}, extra)
    try:
        within, over = shared_pair(c, svc, label, "stopped")
        job = wait_for(
            f"{label}: the over job to end",
            lambda: (lambda j: j if j["state"] not in ("pending", "running") else None)(
                svc.job(over)
            ),
            60,
        )
        said = watchdog_lines(svc.logs(over))
        c.expect(
            job["state"] == "failed" and bool(said),
            f"{label}: the job above its gpu_mem is stopped, the reason in its log",
            f"{job['state']}: {' | '.join(said)}",
        )
        c.expect(
            svc.job(within)["state"] == "running",
            f"{label}: its neighbour on the GPU keeps running",
        )
        svc_said = watchdog_lines(svc.log.read_text())
        c.expect(
            any("stopping it" in ln for ln in svc_said),
            f"{label}: the scheduler's log says it stopped it",
            svc_said[-1] if svc_said else "",
        )
        svc.save_logs(within, over)
        svc.cancel_all()
    finally:
        svc.stop()


def phase_ray(c: Check, out: Path) -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        c.record("SKIP", "ray", "Ray is not installed")
        return
    port = free_port()
    mem = sh("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits")
    first = mem.split()[0] if mem.split() and mem.split()[0].isdigit() else ""
    labels = "aisched/name=gpunode" + (f",aisched/gpu-mem={first}M" if first else "")
    ray_bin = str(Path(PY).parent / "ray")
    # A shared cluster asks for its token (aisched up as root refuses one that does not); the
    # service started below inherits it from this process.
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    env = {**os.environ, "RAY_enable_metrics_collection": "0"}
    started = subprocess.run(
        [ray_bin, "start", "--head", f"--port={port}", "--num-cpus=4",
         f"--num-gpus={gpu_count()}", "--include-dashboard=false", "--disable-usage-stats",
         f"--labels={labels}"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    (out / "ray-start.txt").write_text(started.stdout + started.stderr)
    if started.returncode != 0:
        c.record("FAIL", "ray: ray start", started.stderr[-500:])
        return
    try:
        phase_stop(c, out, "ray stop", ["--ray", f"127.0.0.1:{port}"])
    finally:
        sh(ray_bin, "stop", "--force", timeout_s=60)


def main() -> int:
    # Stopped by `timeout`: the phases' `finally` still stop their services (and Ray).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    out = Path(sys.argv[1]).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    c = Check(out)
    c.record("INFO", "GPUs", sh("nvidia-smi", "-L").strip().replace("\n", " | "))
    if not shutil.which("nvidia-smi") or gpu_count() == 0:
        c.record("FAIL", "an NVIDIA GPU", "nvidia-smi finds none")
        return 1
    phases: list[tuple[str, Callable[[], None]]] = [
        ("local report", lambda: phase_local_report(c, out)),
        ("local stop", lambda: phase_stop(c, out, "local stop", [])),
        ("ray", lambda: phase_ray(c, out)),
    ]
    for name, run in phases:
        if left_s() < 30:
            c.record("SKIP", name, "out of time")
            continue
        try:
            run()
        except Exception as e:
            c.record("FAIL", name, f"{type(e).__name__}: {e}")
    c.record("INFO", "done", f"{'some check failed' if c.failed else 'all checks passed'}")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
