"""Tasks that share a GPU see the same device: the core's bindings on a node with declared GPUs,
turned into each task's contract environment and launched as real processes."""

from __future__ import annotations

import json

from executor_harness import NODE, PY, Harness

from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind
from aisched.core.policy import preset
from aisched.core.snapshot import snapshot_of
from aisched.model.cluster import Cluster
from aisched.testing import job

SHOW = "import json, os; print(json.dumps(os.environ.get('CUDA_VISIBLE_DEVICES')))"


def test_shared_gpu_tasks_get_the_same_cuda_visible_devices(harness: Harness) -> None:
    pending = [
        job("half-a").task(gpu_milli=500, cpu=0.5).pending(),
        job("half-b").task(gpu_milli=500, cpu=0.5).pending(),
        job("whole").task(gpu=1, cpu=0.5).pending(),
    ]
    result = run_cycle(snapshot_of(Cluster((NODE,))), pending, preset("fifo"), 0.0)
    binds = {d.job_id: d.tasks[0] for d in result.decisions if isinstance(d, Bind)}
    assert {j: (t.gpus, t.gpu_milli) for j, t in binds.items()} == {
        "half-a": ((0,), 500),
        "half-b": ((0,), 500),
        "whole": ((1,), 1000),
    }
    seen: dict[str, str] = {}
    for job_id, t in binds.items():
        task = f"{job_id}-0"
        h = harness.launch(task, [PY, "-c", SHOW], gpus=t.gpus, milli_cpu=t.milli_cpu)
        harness.exit_of(h.key)
        seen[job_id] = json.loads(harness.log(task))
    assert seen == {"half-a": "0", "half-b": "0", "whole": "1"}
