"""Whether a job could ever fit (`placement.never_fits`) is judged on the job alone. The verdict
is kept per shape for the cluster, so it must not hang on what else waits: fgd scores by the
workload's task mix, and with another mix its greedy placement on the empty cluster can put a
job's CPU-only task where its GPU tasks then lack CPUs, calling a job that fits "never fits"
(and the simulator and the service refuse such a job)."""

from __future__ import annotations

from aisched.core.cycle import run_cycle
from aisched.core.policy import preset
from aisched.core.snapshot import snapshot_of
from aisched.core.status import StatusCode
from aisched.testing import cluster, job, node, pending

# 16 CPUs and 3 GPUs in all: the job below fits only with its CPU-only task on n1.
CLUSTER = cluster(
    node("n0").gpus(2).cpus(8).mem_gib(8),
    node("n1").gpus(1).cpus(8).mem_gib(8),
)
TIGHT = job("tight").task(1, cpu=4, name="ps").task(3, gpu=1, cpu=4, name="worker")


def test_a_job_that_fits_the_empty_cluster_is_never_called_never_fitting_under_fgd() -> None:
    others = [job(f"small{i}").task(gpu=1) for i in range(6)]
    for queue in (pending(TIGHT), pending(*others, TIGHT)):
        result = run_cycle(snapshot_of(CLUSTER, ()), queue, preset("fgd"), 0.0)
        status = result.diagnostics["tight"]
        assert status.code != StatusCode.NEVER_FITS, status.reason
