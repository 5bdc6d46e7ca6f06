"""The device check of container GPU tasks (docs/containers.md, "Limits": the GPU row).

Run by `scripts/gpu_check.sh` after its other checks, on a machine with NVIDIA GPUs, podman
and busybox-static. Starts a real `aisched up` (GPUs found through NVML), builds the test
image from this machine's files (tests/e2e/container_image.py), and runs a one-GPU container
job that prints what it sees:

- CUDA_VISIBLE_DEVICES: must be 0 (the task's GPUs renumbered from 0);
- NVIDIA_VISIBLE_DEVICES: the host index, without a CDI spec (shown, not checked);
- the NVIDIA device nodes in its /dev: exactly one GPU's (plus the control nodes);
- `nvidia-smi -L`, where the CDI spec or the NVIDIA hook put it in: exactly one GPU listed.

Writes the service's log, the job's log and `summary.txt` (PASS/FAIL/SKIP lines) to OUTDIR
(argument 1). Exit status 0 unless a check failed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = (
    "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; "
    "echo NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-unset}; "
    "echo gpu-devices=$(ls /dev | grep -c '^nvidia[0-9]'); "
    "if command -v nvidia-smi >/dev/null; then nvidia-smi -L; else echo no-nvidia-smi; fi"
)


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    summary: list[str] = []

    def say(line: str) -> None:
        print(line)
        summary.append(line)

    try:
        sys.path.insert(0, str(ROOT / "tests" / "e2e"))
        from container_image import build_test_image, missing_tools

        why = missing_tools()
        if why is not None:
            say(f"SKIP container GPU: {why}")
            return 0
        image = build_test_image()
        home = out / "home"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "AISCHED_SERVER": f"http://127.0.0.1:{port}"}
        aisched = [sys.executable, "-m", "aisched"]
        log = open(out / "service.log", "wb")  # noqa: SIM115 - the child writes it
        svc = subprocess.Popen(
            [*aisched, "up", "--port", str(port), "--data-dir", str(home)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            for _ in range(300):
                r = subprocess.run([*aisched, "nodes", "--json"], env=env, capture_output=True)
                if r.returncode == 0:
                    break
                time.sleep(0.1)
            run = subprocess.run(
                [*aisched, "run", "--json", "--image", image, "--gpus", "1", "--restart",
                 "never", "--", "sh", "-c", PROBE],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            jid = str(json.loads(run.stdout)["id"])
            state = ""
            for _ in range(600):
                show = subprocess.run([*aisched, "show", "--json", jid], env=env,
                                      capture_output=True, text=True, check=True)  # fmt: skip
                state = json.loads(show.stdout)["state"]
                if state in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(0.1)
            text = subprocess.run([*aisched, "logs", jid], env=env, capture_output=True,
                                  text=True).stdout  # fmt: skip
            (out / "job.log").write_text(text)
            lines = dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)
            gpus_listed = [ln for ln in text.splitlines() if ln.startswith("GPU ")]
            checks = [
                ("the job succeeded", state == "succeeded"),
                ("CUDA_VISIBLE_DEVICES=0 inside", lines.get("CUDA_VISIBLE_DEVICES") == "0"),
                ("one GPU device node inside", lines.get("gpu-devices") == "1"),
                (
                    "nvidia-smi lists one GPU (or is absent)",
                    len(gpus_listed) == 1 or "no-nvidia-smi" in text,
                ),
            ]
            for what, ok in checks:
                say(f"{'PASS' if ok else 'FAIL'} container GPU: {what}")
            say(f"INFO NVIDIA_VISIBLE_DEVICES={lines.get('NVIDIA_VISIBLE_DEVICES')}")
        finally:
            svc.terminate()
            svc.wait(20)
            log.close()
    except Exception as e:  # noqa: BLE001 - any failure is a FAIL line, with what it was
        say(f"FAIL container GPU: {type(e).__name__}: {e}")
    finally:
        (out / "summary.txt").write_text("\n".join(summary) + "\n")
    return 1 if any(s.startswith("FAIL") for s in summary) else 0


if __name__ == "__main__":
    if shutil.which("nvidia-smi") is None:
        print("SKIP container GPU: no nvidia-smi on this machine")
        sys.exit(0)
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_container_check_out")))
