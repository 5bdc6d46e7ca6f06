#!/usr/bin/env bash
# The device check of GPU sharing and the GPU-memory watchdog (scripts/gpu_check.py; what it
# checks: docs/service.md, "Checking it on a GPU machine"). Run it from a checkout on a machine
# with NVIDIA GPUs and their driver:
#
#   scripts/gpu_check.sh            # results under $OUT/gpu_check if OUT is set, else ./gpu_check_out
#
# Then the container GPU check (scripts/gpu_container_check.py: CDI devices or
# NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES renumbered inside), where podman is installed.
#
# Python: $AISCHED_PYTHON if set; else a virtual environment made here (.venv-gpu, with the
# system's site packages, so an installed torch, cupy or Ray is used) with the project
# installed in it, Ray extra included when the package index can be reached. Takes under
# seven minutes in all; exit status 0 when every check passed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
outdir="${OUT:+$OUT/gpu_check}"
outdir="${outdir:-$root/gpu_check_out}"
started=$(date +%s)

py="${AISCHED_PYTHON:-}"
if [ -z "$py" ]; then
  venv="$root/.venv-gpu"
  [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
  py="$venv/bin/python"
  if ! "$py" -c 'import aisched' 2>/dev/null; then
    # With its dependencies (and Ray) from the index; offline, with what the system has.
    timeout 150 "$py" -m pip install -q -e "$root[ray]" \
      || timeout 100 "$py" -m pip install -q -e "$root" \
      || "$py" -m pip install -q --no-deps --no-build-isolation -e "$root"
  fi
fi
"$py" -c 'import aisched, pynvml' || { echo "error: aisched or nvidia-ml-py is not importable by $py" >&2; exit 2; }

# What is left of the five minutes goes to the checks (each phase is skipped when short).
budget=$(( 280 - ($(date +%s) - started) ))
if [ "$budget" -lt 60 ]; then echo "error: the install took too long (${budget}s left)" >&2; exit 1; fi
echo "python: $py; results: $outdir; ${budget}s for the checks"
status=0
GPU_CHECK_BUDGET_S="$budget" timeout $(( budget + 15 )) "$py" "$root/scripts/gpu_check.py" "$outdir" \
  || status=$?
# Container tasks on a GPU (docs/containers.md; skipped without podman or busybox-static).
timeout 120 "$py" "$root/scripts/gpu_container_check.py" "$outdir/containers" || status=$?
exit "$status"
